"""The OpenAI Responses dialect (``POST /v1/responses``, what the Agents SDK speaks), caller
and provider.

In order: the caller's request (validated, translated to the neutral request), the provider's
request (translated from the neutral request), the stream encoder (OpenAI's events, their
``sequence_number`` from 0; the terminal ``response.completed`` / ``response.incomplete``
held until the step is acknowledged, :meth:`ResponsesStreamEncoder.end`), the response and
error bodies, then the :class:`OpenAIResponses` codec and its forwarder. What each field
becomes on the way, and the events in order: docs/gateway.md, "Dialects".
"""

from __future__ import annotations

from typing import Any, assert_never

import msgspec

from tokenwire.providers import Dialect
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
from tokenwire.services.gateway._dialects.base import (
    CallerDialect,
    Reply,
    frame,
    openai_error_type,
)
from tokenwire.services.gateway._dialects.neutral import (
    NeutralMessage,
    NeutralRequest,
    NeutralTool,
    OutputFormat,
    ToolChoice,
)
from tokenwire.services.gateway._dialects.openai_chat import openai_error_body
from tokenwire.services.gateway._dialects.validate import (
    OpenAITemperature,
    OutputTokens,
    UnitInterval,
    convert,
)
from tokenwire.services.gateway._errors import GatewayError, InvalidRequestError
from tokenwire.sse import SseEvent


class ResponsesRequest(msgspec.Struct, frozen=True):
    """The fields of a Responses request the gateway reads (the rest is forwarded)."""

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: OutputTokens | None = None
    temperature: OpenAITemperature | None = None
    top_p: UnitInterval | None = None
    parallel_tool_calls: bool | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None

    @property
    def include_usage(self) -> bool:
        """Responses always reports usage in its final event."""
        return True

    @property
    def ends_with_tool_result(self) -> bool:
        """Whether the last input item returns a tool result (same turn, next step)."""
        if isinstance(self.input, str) or not self.input:
            return False
        return self.input[-1].get("type") == "function_call_output"

    @property
    def opens_conversation(self) -> bool:
        """Input text, or only messages not from the assistant (no function call, output or
        reasoning item): the conversation's first call."""
        if isinstance(self.input, str):
            return True
        return all(
            i.get("type", "message") == "message" and i.get("role") != "assistant"
            for i in self.input
        )


def validate_responses(body: dict[str, Any]) -> ResponsesRequest:
    """Check the types of a decoded Responses body; a 400 names the first bad field."""
    return convert(body, ResponsesRequest)


def responses_to_neutral(req: ResponsesRequest) -> NeutralRequest:
    """Translate a validated request; items without a neutral meaning raise a 400."""
    messages: list[NeutralMessage] = []
    system = [req.instructions] if req.instructions else []
    items = [{"role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    for i, item in enumerate(items):
        role = item.get("role")
        if role in ("system", "developer"):
            system.append(_plain_text(item.get("content"), i))
            continue
        _add(messages, _item(item, i))
    reasoning = req.reasoning or {}
    return NeutralRequest(
        messages=messages,
        system="\n\n".join(system) or None,
        tools=[_caller_tool(t, i) for i, t in enumerate(req.tools or [])],
        tool_choice=_tool_choice(req.tool_choice),
        max_tokens=req.max_output_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        stream=req.stream,
        include_usage=True,
        output_format=_output_format(req.text),
        reasoning_effort=reasoning.get("effort"),
        parallel_tool_calls=req.parallel_tool_calls,
        user=req.user,
        safety_identifier=req.safety_identifier,
        metadata=req.metadata,
        store=req.store,
    )


def _add(messages: list[NeutralMessage], message: NeutralMessage) -> None:
    """Consecutive items of one role form one message (a turn's calls, a step's results)."""
    if messages and messages[-1].role == message.role and message.role != "user":
        last = messages[-1]
        messages[-1] = NeutralMessage(last.role, [*last.content, *message.content])
    else:
        messages.append(message)


def _item(item: dict[str, Any], i: int) -> NeutralMessage:
    kind = item.get("type", "message")
    match kind:
        case "message":
            role = item.get("role")
            if role not in ("user", "assistant"):
                raise InvalidRequestError(
                    f"input item role {role!r} is unknown", param=f"input[{i}]"
                )
            return NeutralMessage(role, _parts(item.get("content"), i))
        case "function_call":
            call = ToolCallBlock(
                str(item.get("call_id")), str(item.get("name")), str(item.get("arguments", ""))
            )
            return NeutralMessage("assistant", [call])
        case "function_call_output":
            output = item.get("output", "")
            text = output if isinstance(output, str) else _plain_text(output, i)
            return NeutralMessage("tool", [ToolResultBlock(str(item.get("call_id")), text)])
        case "reasoning":
            summary = item.get("summary") or []
            text = "\n\n".join(s.get("text", "") for s in summary if isinstance(s, dict))
            return NeutralMessage("assistant", [ReasoningBlock(text)])
    raise InvalidRequestError(
        f"input item type {kind!r} cannot be translated to another dialect", param=f"input[{i}]"
    )


def _parts(content: Any, i: int) -> list[ContentBlock]:
    if isinstance(content, str):
        return [TextBlock(content)] if content else []
    if not isinstance(content, list):
        raise InvalidRequestError("message content must be text or parts", param=f"input[{i}]")
    out: list[ContentBlock] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
            out.append(TextBlock(part["text"]))
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            out.append(_image(part["image_url"]))
        elif kind == "refusal":
            out.append(TextBlock(str(part.get("refusal", ""))))
        else:
            raise InvalidRequestError(
                f"content part {kind!r} cannot be translated", param=f"input[{i}].content"
            )
    return out


def _image(url: str) -> ImageBlock:
    if url.startswith("data:") and ";base64," in url:
        media_type, data = url[5:].split(";base64,", 1)
        return ImageBlock(media_type=media_type, data=data)
    return ImageBlock(media_type="image/*", url=url)


def _plain_text(content: Any, i: int) -> str:
    blocks = _parts(content, i)
    if any(not isinstance(b, TextBlock) for b in blocks):
        raise InvalidRequestError("only text is allowed here", param=f"input[{i}]")
    return "".join(b.text for b in blocks if isinstance(b, TextBlock))


def _caller_tool(tool: dict[str, Any], i: int) -> NeutralTool:
    if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        raise InvalidRequestError(
            f"tool type {tool.get('type')!r} cannot be translated", param=f"tools[{i}]"
        )
    params = tool.get("parameters") or {"type": "object", "properties": {}}
    return NeutralTool(tool["name"], tool.get("description"), params, tool.get("strict") is True)


def _tool_choice(choice: str | dict[str, Any] | None) -> ToolChoice | None:
    match choice:
        case None:
            return None
        case "auto" | "none" | "required":
            return ToolChoice(choice)
        case {"type": "function", "name": str(name)}:
            return ToolChoice("tool", name)
    raise InvalidRequestError("tool_choice cannot be translated", param="tool_choice")


def _output_format(text: dict[str, Any] | None) -> OutputFormat | None:
    fmt = (text or {}).get("format")
    match fmt:
        case None | {"type": "text"}:
            return None
        case {"type": "json_object"}:
            return OutputFormat("json_object")
        case {"type": "json_schema", "schema": dict(schema)}:
            return OutputFormat("json_schema", schema, fmt.get("name"), fmt.get("strict"))
    raise InvalidRequestError("text.format cannot be translated", param="text")


Item = dict[str, Any]


def neutral_to_responses(req: NeutralRequest, model: str) -> dict[str, Any]:
    """A streaming Responses body for ``model``."""
    if req.stop:
        raise InvalidRequestError(
            "stop sequences cannot be translated to the OpenAI Responses API", param="stop"
        )
    body: dict[str, Any] = {
        "model": model,
        "input": [item for m in req.messages for item in _items(m)],
        "stream": True,
        "store": False,
    }
    if req.system:
        body["instructions"] = req.system
    if req.tools:
        body["tools"] = [_tool(t) for t in req.tools]
    if req.tool_choice is not None:
        mode, name = req.tool_choice.mode, req.tool_choice.name
        body["tool_choice"] = {"type": "function", "name": name} if mode == "tool" else mode
    optional = {
        "max_output_tokens": req.max_tokens,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "parallel_tool_calls": req.parallel_tool_calls,
        "user": req.user,
        "safety_identifier": req.safety_identifier,
        "metadata": req.metadata,
        "store": req.store,
        "service_tier": req.service_tier,
        "prompt_cache_key": req.prompt_cache_key,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if (effort := req.effort) is not None:
        body["reasoning"] = {"effort": effort}
    if (fmt := req.output_format) is not None:
        body["text"] = {"format": _format(fmt)}
    return body


def _format(fmt: OutputFormat) -> Item:
    if fmt.kind == "json_object":
        return {"type": "json_object"}
    out: Item = {"type": "json_schema", "name": fmt.name or "output", "schema": fmt.schema}
    if fmt.strict is not None:
        out["strict"] = fmt.strict
    return out


def _items(m: NeutralMessage) -> list[Item]:
    """The message's items in order; its text and images form one message item."""
    out: list[Item] = []
    content: list[Item] = []
    for b in m.content:
        item, part = _render(b, m.role)
        if part is not None:
            content.append(part)
        if item is not None:
            out.append(item)
    if content:
        out.insert(
            0, {"role": "assistant" if m.role == "assistant" else "user", "content": content}
        )
    return out


def _render(b: ContentBlock, role: str) -> tuple[Item | None, Item | None]:
    """(a standalone item, a part of the message's content) for one block."""
    match b:
        case TextBlock(text=text):
            kind = "output_text" if role == "assistant" else "input_text"
            return None, ({"type": kind, "text": text} if text else None)
        case ImageBlock():
            return None, {"type": "input_image", "image_url": _image_url(b)}
        case ReasoningBlock():
            return None, None
        case ToolCallBlock(id=id_, name=name, arguments=args):
            return {"type": "function_call", "call_id": id_, "name": name, "arguments": args}, None
        case ToolResultBlock(tool_call_id=tid, content=content, is_error=False):
            return {"type": "function_call_output", "call_id": tid, "output": content}, None
        case ToolResultBlock():  # the translation table refuses it first (or drops it)
            raise InvalidRequestError(
                "a tool result's error flag has no counterpart in the Responses API",
                param="messages.content.is_error",
            )
        case _:
            assert_never(b)


def _image_url(b: ImageBlock) -> str:
    return b.url if b.url is not None else f"data:{b.media_type};base64,{b.data}"


def _tool(t: NeutralTool) -> Item:
    tool: Item = {"type": "function", "name": t.name, "parameters": t.parameters}
    tool["strict"] = t.strict  # false unless asked: Responses would make the tool strict
    if t.description is not None:
        tool["description"] = t.description
    return tool


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
            "id": item_id,
            "type": "function_call",
            "status": status,
            "arguments": text,
            "call_id": call_id,
            "name": name,
        }
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": text}
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [part],
    }


class ResponsesStreamEncoder:
    """Encodes one step's chunks as Responses server-sent events."""

    def __init__(self, *, response_id: str, model: str, created: int) -> None:
        self._response = {
            "id": response_id,
            "object": "response",
            "created_at": created,
            "model": model,
            "status": "in_progress",
            "error": None,
            "incomplete_details": None,
            "output": [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": None,
        }
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
        # a reasoning item's summary part is announced with its first text (_summary_part):
        # one without text (encrypted reasoning) has none, as OpenAI streams it
        return out

    def _summary_part(self, item: _Item) -> bytes:
        where = {"item_id": item.id, "output_index": item.output_index}
        return self._event(
            "response.reasoning_summary_part.added",
            {**where, "summary_index": 0, "part": {"type": "summary_text", "text": ""}},
        )

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
            if len(item.parts) == 1:
                out += self._summary_part(item)
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
        elif item.kind == "reasoning" and text:
            out += self._event(
                "response.reasoning_summary_text.done", {**where, "summary_index": 0, "text": text}
            )
            part = {"type": "summary_text", "text": text}
            out += self._event(
                "response.reasoning_summary_part.done", {**where, "summary_index": 0, "part": part}
            )
        elif item.kind == "tool-call":
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
        "id": response_id,
        "object": "response",
        "created_at": created,
        "model": model,
        "status": status,
        "error": None,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": responses_usage(message.usage),
        "incomplete_details": None,
    }
    if incomplete:
        reason = "max_output_tokens" if message.finish_reason == "max-tokens" else "content_filter"
        body["incomplete_details"] = {"reason": reason}
    return _encode(body)


# -- the caller dialect ----------------------------------------------------------------------


class OpenAIResponses:
    """``POST /v1/responses``: the OpenAI Responses API (what the Agents SDK speaks)."""

    dialect: CallerDialect = Dialect.OPENAI_RESPONSES

    def parse(self, body: dict[str, Any]) -> ResponsesRequest:
        return validate_responses(body)

    def to_neutral(self, req: ResponsesRequest) -> NeutralRequest:
        return responses_to_neutral(req)

    def forwarded_body(self, body: dict[str, Any], model: str) -> bytes:
        return _encode({**body, "model": model, "stream": True})

    def encoder(self, req: ResponsesRequest, reply: Reply) -> ResponsesStreamEncoder:
        return ResponsesStreamEncoder(
            response_id=reply.response_id, model=reply.model, created=reply.created
        )

    def forwarder(self, req: ResponsesRequest) -> ResponsesForwarder:
        return ResponsesForwarder()

    def reply_id(self, raw_id: str) -> str:
        return f"resp_{raw_id}"

    def message_body(self, message: Message, reply: Reply) -> bytes:
        return responses_object(
            message, response_id=reply.response_id, model=reply.model, created=reply.created
        )

    def error_body(self, exc: GatewayError) -> bytes:
        return openai_error_body(
            exc.message, openai_error_type(exc), param=exc.param, code=exc.code
        )


class ResponsesForwarder:
    """The provider's Responses events as they are read, but the terminal
    ``response.completed`` / ``response.incomplete``, held for the acks."""

    def __init__(self) -> None:
        self.error_sent = False
        self._held: list[SseEvent] = []

    def forwarded(self, event: SseEvent) -> bool:
        if event.event in ("response.completed", "response.incomplete"):
            self._held.append(event)
            return False
        if event.event in ("error", "response.failed"):
            self.error_sent = True
        return True

    def end(self) -> bytes:
        return b"".join(frame(e) for e in self._held)

    def failure(self, message: str) -> bytes:
        return responses_error_event(message, "server_error", 0)
