"""Normalised chunks to the OpenAI Responses API: the streamed events, the response, the error.

Events as OpenAI sends them (the openai-responses recordings): ``response.created`` and
``response.in_progress`` first; per block an output item (``message`` with one
``output_text`` part, ``reasoning`` with one summary part, ``function_call``) opened by
``response.output_item.added`` (and ``content_part.added`` / ``reasoning_summary_part.added``),
its deltas (``output_text.delta``, ``reasoning_summary_text.delta``,
``function_call_arguments.delta``), then its ``.done`` events and ``output_item.done``; the
response ends with ``response.completed``, ``response.incomplete`` (max tokens, content
filter) or ``response.failed``. Every event has ``sequence_number`` 0, 1, 2, ... in order.
The terminal ``response.completed`` / ``response.incomplete`` is the stream's terminator: it
is held until the step is acknowledged (:meth:`ResponsesStreamEncoder.end`).
"""

from __future__ import annotations

from typing import Any, assert_never

import msgspec

from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    BlockType,
    ContentBlock,
    Finish,
    ImageBlock,
    Message,
    ReasoningBlock,
    ReasoningDelta,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallBlock,
    ToolCallDelta,
    ToolResultBlock,
    Usage,
)

_encode = msgspec.json.encode


def responses_usage(usage: TokenUsage | None) -> dict[str, Any]:
    """Disjoint counts folded back into Responses' totals."""
    u = usage or TokenUsage()
    cached = u.cache_read_tokens or 0
    prompt = (u.input_tokens or 0) + cached + (u.cache_write_tokens or 0)
    output = (u.output_tokens or 0) + (u.reasoning_tokens or 0)
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens or 0},
        "total_tokens": prompt + output,
    }


def responses_error_event(message: str, code: str, sequence_number: int) -> bytes:
    """The in-stream ``error`` event (the SDK raises on it)."""
    body = {"type": "error", "code": code, "message": message, "param": None}
    return _sse("error", {**body, "sequence_number": sequence_number})


def _sse(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _encode(data) + b"\n\n"


class _Item:
    """One output item being streamed: its kind, ids, and what arrived."""

    __slots__ = ("call_id", "id", "kind", "name", "output_index", "parts", "status")

    def __init__(self, kind: BlockType, item_id: str, output_index: int) -> None:
        self.kind: BlockType = kind
        self.id = item_id
        self.output_index = output_index
        self.parts: list[str] = []
        self.call_id = ""
        self.name = ""
        self.status = "in_progress"

    def text(self) -> str:
        return "".join(self.parts)

    def done(self, status: str | None = None) -> dict[str, Any]:
        status = status or self.status
        return _item_object(self.kind, self.id, self.text(), status, self.call_id, self.name)


def _item_object(
    kind: BlockType, item_id: str, text: str, status: str, call_id: str = "", name: str = ""
) -> dict[str, Any]:
    if kind == "reasoning":
        summary = [{"type": "summary_text", "text": text}] if text else []
        return {"id": item_id, "type": "reasoning", "summary": summary}
    if kind == "tool-call":
        return {
            "id": item_id, "type": "function_call", "status": status, "arguments": text,
            "call_id": call_id, "name": name,
        }  # fmt: skip
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [part]}  # fmt: skip


class ResponsesStreamEncoder:
    """Encodes one step's chunks as Responses server-sent events."""

    def __init__(self, *, response_id: str, model: str, created: int) -> None:
        self._response = {
            "id": response_id, "object": "response", "created_at": created, "model": model,
            "status": "in_progress", "error": None, "incomplete_details": None, "output": [],
            "parallel_tool_calls": True, "tool_choice": "auto", "tools": [], "usage": None,
        }  # fmt: skip
        self._seq = 0
        self._items: dict[int, _Item] = {}
        self._order: list[_Item] = []
        self._usage: TokenUsage | None = None
        self._terminal = b""

    def start(self) -> bytes:
        """``response.created`` and ``response.in_progress``."""
        created = self._event("response.created", {"response": self._response})
        return created + self._event("response.in_progress", {"response": self._response})

    def encode(self, chunk: StreamChunk) -> bytes:
        """The SSE bytes for ``chunk`` (often empty); the terminal event waits for :meth:`end`."""
        match chunk:
            case BlockStart(index=index, block_type=block_type):
                return self._open(index, block_type, None)[1]
            case TextDelta(index=index, text=text):
                return self._delta(index, "text", text, None)
            case ReasoningDelta(index=index, text=text):
                return self._delta(index, "reasoning", text, None)
            case ToolCallDelta():
                return self._delta(chunk.index, "tool-call", chunk.arguments_delta, chunk)
            case BlockEnd(index=index, block=block):
                return self._end_block(index, block)
            case Usage(usage=usage):
                self._usage = usage
                return b""
            case Finish():
                return self._finish(chunk)
            case _:
                assert_never(chunk)

    def end(self) -> bytes:
        """The terminal ``response.completed`` / ``response.incomplete`` (after the acks)."""
        return self._terminal

    def failure(self, message: str) -> bytes:
        """``response.failed`` for a step that failed after the stream began."""
        response = {**self._response, "status": "failed", "output": self._outputs()}
        response["error"] = {"code": "server_error", "message": message}
        return self._event("response.failed", {"response": response})

    # -- items ----------------------------------------------------------------------------

    def _open(self, index: int, kind: BlockType, call: ToolCallDelta | None) -> tuple[_Item, bytes]:
        item = self._items.get(index)
        if item is not None:
            return item, b""
        if kind in ("tool-result", "image"):
            kind = "text"  # never produced by a provider normaliser; shown as text if ever
        prefix = {"text": "msg_", "reasoning": "rs_", "tool-call": "fc_"}.get(kind, "msg_")
        item = _Item(kind, f"{prefix}{self._response['id']}_{len(self._order)}", len(self._order))
        if call is not None:
            item.call_id, item.name = call.id, call.name or ""
        self._items[index] = item
        self._order.append(item)
        if kind == "tool-call" and call is None:
            return item, b""  # announced with its first delta, which brings id and name
        return item, self._added(item)

    def _added(self, item: _Item) -> bytes:
        where = {"output_index": item.output_index}
        out = self._event("response.output_item.added", {**where, "item": item.done("in_progress")})
        if item.kind == "text":
            part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
            out += self._event(
                "response.content_part.added",
                {"item_id": item.id, **where, "content_index": 0, "part": part},
            )
        elif item.kind == "reasoning":
            out += self._event(
                "response.reasoning_summary_part.added",
                {"item_id": item.id, **where, "summary_index": 0,
                 "part": {"type": "summary_text", "text": ""}},
            )  # fmt: skip
        return out

    def _delta(self, index: int, kind: BlockType, text: str, call: ToolCallDelta | None) -> bytes:
        item = self._items.get(index)
        out = b""
        if item is None:
            item, out = self._open(index, kind, call)
        if kind == "tool-call" and not item.call_id and call is not None:
            item.call_id, item.name = call.id, call.name or ""
            out += self._added(item)
        if not text:
            return out
        item.parts.append(text)
        where = {"item_id": item.id, "output_index": item.output_index}
        if kind == "text":
            fields = {**where, "content_index": 0, "delta": text, "logprobs": []}
            return out + self._event("response.output_text.delta", fields)
        if kind == "reasoning":
            fields = {**where, "summary_index": 0, "delta": text}
            return out + self._event("response.reasoning_summary_text.delta", fields)
        return out + self._event("response.function_call_arguments.delta", {**where, "delta": text})

    def _end_block(self, index: int, block: ContentBlock) -> bytes:
        item = self._items.get(index)
        out = b""
        if item is None:  # content only in the block-end (no deltas): stream it whole now
            kind, text, call = _whole(index, block)
            out += self._delta(index, kind, text, call)
            item = self._items[index]
        elif isinstance(block, ReasoningBlock | TextBlock) and not item.parts and block.text:
            out += self._delta(index, item.kind, block.text, None)
        return out + self._done(index)

    def _done(self, index: int, status: str = "completed") -> bytes:
        item = self._items.pop(index)
        where = {"item_id": item.id, "output_index": item.output_index}
        text = item.text()
        out = b""
        if item.kind == "text":
            out += self._event(
                "response.output_text.done",
                {**where, "content_index": 0, "text": text, "logprobs": []},
            )
            part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
            out += self._event(
                "response.content_part.done", {**where, "content_index": 0, "part": part}
            )
        elif item.kind == "reasoning":
            out += self._event(
                "response.reasoning_summary_text.done", {**where, "summary_index": 0, "text": text}
            )
            part = {"type": "summary_text", "text": text}
            out += self._event(
                "response.reasoning_summary_part.done", {**where, "summary_index": 0, "part": part}
            )
        else:
            out += self._event(
                "response.function_call_arguments.done", {**where, "arguments": text}
            )
        item.parts, item.status = [text], status
        done = {"output_index": item.output_index, "item": item.done()}
        return out + self._event("response.output_item.done", done)

    # -- the end ----------------------------------------------------------------------------

    def _finish(self, chunk: Finish) -> bytes:
        if chunk.reason in ("error", "aborted"):
            message = chunk.error.message if chunk.error else "the step was aborted"
            return self.failure(message)
        status = "incomplete" if chunk.reason in ("max-tokens", "content-filter") else "completed"
        out = b""
        for index in sorted(self._items):
            out += self._done(index, status)  # open at the finish (delta-only or cut)
        response = {**self._response, "status": status, "output": self._outputs()}
        response["usage"] = responses_usage(self._usage)
        if status == "incomplete":
            reason = "max_output_tokens" if chunk.reason == "max-tokens" else "content_filter"
            response["incomplete_details"] = {"reason": reason}
        self._terminal = self._event(f"response.{status}", {"response": response})
        return out

    def _outputs(self) -> list[dict[str, Any]]:
        return [item.done() for item in self._order if item.kind != "tool-call" or item.call_id]

    def _event(self, name: str, fields: dict[str, Any]) -> bytes:
        data = {"type": name, **fields, "sequence_number": self._seq}
        self._seq += 1
        return _sse(name, data)


def _whole(index: int, block: ContentBlock) -> tuple[BlockType, str, ToolCallDelta | None]:
    match block:
        case TextBlock(text=text):
            return "text", text, None
        case ReasoningBlock(text=text):
            return "reasoning", text, None
        case ToolCallBlock(id=id_, name=name, arguments=args):
            return "tool-call", args, ToolCallDelta(index, id_, name, args)
        case ToolResultBlock() | ImageBlock():
            return "text", "", None
        case _:
            assert_never(block)


def responses_object(message: Message, *, response_id: str, model: str, created: int) -> bytes:
    """The non-streaming ``response`` object for a folded message."""
    incomplete = message.finish_reason in ("max-tokens", "content-filter")
    status = "incomplete" if incomplete else "completed"
    output = []
    for i, block in enumerate(message.content):
        item_id = f"{response_id}_{i}"
        match block:
            case TextBlock(text=text):
                output.append(_item_object("text", f"msg_{item_id}", text, "completed"))
            case ReasoningBlock(text=text):
                output.append(_item_object("reasoning", f"rs_{item_id}", text, "completed"))
            case ToolCallBlock(id=id_, name=name, arguments=args):
                output.append(
                    _item_object("tool-call", f"fc_{item_id}", args, "completed", id_, name)
                )
            case ToolResultBlock() | ImageBlock():
                pass
            case _:
                assert_never(block)
    body: dict[str, Any] = {
        "id": response_id, "object": "response", "created_at": created, "model": model,
        "status": status, "error": None, "output": output, "parallel_tool_calls": True,
        "tool_choice": "auto", "tools": [], "usage": responses_usage(message.usage),
        "incomplete_details": None,
    }  # fmt: skip
    if incomplete:
        reason = "max_output_tokens" if message.finish_reason == "max-tokens" else "content_filter"
        body["incomplete_details"] = {"reason": reason}
    return _encode(body)
