"""Normalised chunks to Anthropic Messages: the streamed events, the message, the error.

Anthropic numbers content blocks 0, 1, 2... in the order they open and needs a tool call's id
and name when its block opens, so the encoder maps each normalised ``index`` to the next
Anthropic index when the block first shows content (for a tool call: its first fragment, which
carries id and name). Blocks that are never closed by ``block-end`` (delta-only protocols) are
closed before ``message_delta``.
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
    FinishReason,
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

_STOP: dict[FinishReason, str] = {
    "stop": "end_turn",
    "tool-calls": "tool_use",
    "max-tokens": "max_tokens",
    "content-filter": "refusal",
    "refusal": "refusal",
    "error": "end_turn",
    "aborted": "end_turn",
}
_encode = msgspec.json.encode
MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


def anthropic_usage(usage: TokenUsage | None) -> dict[str, int]:
    """Disjoint counts in Anthropic's fields (its output count includes thinking)."""
    if usage is None:
        return {"input_tokens": 0, "output_tokens": 0}
    return {
        "input_tokens": usage.input_tokens or 0,
        "output_tokens": (usage.output_tokens or 0) + (usage.reasoning_tokens or 0),
        "cache_read_input_tokens": usage.cache_read_tokens or 0,
        "cache_creation_input_tokens": usage.cache_write_tokens or 0,
    }


def anthropic_error_body(message: str, kind: str) -> bytes:
    """Anthropic's error object, the body of every error on ``/v1/messages``."""
    return _encode({"type": "error", "error": {"type": kind, "message": message}})


def anthropic_stream_error(message: str, kind: str) -> bytes:
    """The in-stream ``error`` event the Anthropic SDK raises on."""
    return b"event: error\ndata: " + anthropic_error_body(message, kind) + b"\n\n"


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + _encode(data) + b"\n\n"


def _empty_block(kind: BlockType, delta: ToolCallDelta | None) -> dict[str, Any]:
    if kind == "reasoning":
        return {"type": "thinking", "thinking": "", "signature": ""}
    if kind == "tool-call" and delta is not None:
        return {"type": "tool_use", "id": delta.id, "name": delta.name or "", "input": {}}
    return {"type": "text", "text": ""}


class AnthropicStreamEncoder:
    """Encodes one step's chunks as Anthropic Messages server-sent events."""

    def __init__(self, *, message_id: str, model: str) -> None:
        self._id = message_id
        self._model = model
        self._slot: dict[int, int] = {}
        self._open: dict[int, BlockType] = {}
        self._usage: TokenUsage | None = None

    def start(self) -> bytes:
        """``message_start`` with an empty message (usage arrives with ``message_delta``)."""
        message: dict[str, Any] = {
            "id": self._id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": anthropic_usage(None),
        }
        return _event("message_start", {"type": "message_start", "message": message})

    def encode(self, chunk: StreamChunk) -> bytes:
        """The SSE bytes for ``chunk`` (``b""`` when it has no Anthropic counterpart yet)."""
        match chunk:
            case BlockStart(index=index, block_type=kind):
                return b"" if kind == "tool-call" else self._opened(index, kind, None)
            case TextDelta(index=index, text=text):
                head = self._opened(index, "text", None)
                return head + self._delta(index, {"type": "text_delta", "text": text})
            case ReasoningDelta(index=index, text=text):
                head = self._opened(index, "reasoning", None)
                return head + self._delta(index, {"type": "thinking_delta", "thinking": text})
            case ToolCallDelta(index=index, arguments_delta=args):
                head = self._opened(index, "tool-call", chunk)
                delta = {"type": "input_json_delta", "partial_json": args}
                return head + (self._delta(index, delta) if args else b"")
            case BlockEnd(index=index, block=block):
                return self._block_end(index, block)
            case Usage(usage=usage):
                self._usage = usage
                return b""
            case Finish():
                return self._finish(chunk)
            case _:
                assert_never(chunk)

    def _opened(self, index: int, kind: BlockType, delta: ToolCallDelta | None) -> bytes:
        """``content_block_start`` the first time ``index`` shows up, else nothing."""
        if index in self._slot:
            return b""
        self._slot[index] = len(self._slot)
        self._open[index] = kind
        block = _empty_block(kind, delta)
        data = {"type": "content_block_start", "index": self._slot[index], "content_block": block}
        return _event("content_block_start", data)

    def _delta(self, index: int, delta: dict[str, Any]) -> bytes:
        data = {"type": "content_block_delta", "index": self._slot[index], "delta": delta}
        return _event("content_block_delta", data)

    def _stop(self, index: int) -> bytes:
        self._open.pop(index, None)
        data = {"type": "content_block_stop", "index": self._slot[index]}
        return _event("content_block_stop", data)

    def _block_end(self, index: int, block: ContentBlock) -> bytes:
        if index in self._slot:
            if index not in self._open:
                return b""  # already closed: a misbehaving adapter's duplicate end
            tail = b""
            if isinstance(block, ReasoningBlock) and block.signature:
                tail = self._delta(index, {"type": "signature_delta", "signature": block.signature})
            return tail + self._stop(index)
        return self._whole_block(index, block)

    def _whole_block(self, index: int, block: ContentBlock) -> bytes:
        match block:
            case TextBlock(text=text):
                out = self._opened(index, "text", None)
                out += self._delta(index, {"type": "text_delta", "text": text})
            case ReasoningBlock():
                out = self._whole_reasoning(index, block)
            case ToolCallBlock(id=id_, name=name, arguments=args):
                out = self.encode(ToolCallDelta(index, id_, name, args))
            case ToolResultBlock() | ImageBlock():
                return b""
            case _:
                assert_never(block)
        return out + self._block_end(index, block)

    def _whole_reasoning(self, index: int, block: ReasoningBlock) -> bytes:
        if block.redacted is None:
            out = self._opened(index, "reasoning", None)
            return out + self._delta(index, {"type": "thinking_delta", "thinking": block.text})
        self._slot[index] = len(self._slot)
        self._open[index] = "reasoning"
        content = {"type": "redacted_thinking", "data": block.redacted}
        data = {"type": "content_block_start", "index": self._slot[index], "content_block": content}
        return _event("content_block_start", data)

    def _finish(self, chunk: Finish) -> bytes:
        out = b"".join(self._stop(i) for i in list(self._open))
        if chunk.reason in ("error", "aborted"):
            message = chunk.error.message if chunk.error else "the step was aborted"
            return out + anthropic_stream_error(message, "api_error")
        delta = {"stop_reason": _STOP[chunk.reason], "stop_sequence": None}
        data = {"type": "message_delta", "delta": delta, "usage": anthropic_usage(self._usage)}
        return out + _event("message_delta", data)


def anthropic_message(message: Message, *, message_id: str, model: str) -> bytes:
    """The non-streaming ``message`` object for a folded message."""
    content = [c for c in (_content(b) for b in message.content) if c is not None]
    body = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": _STOP[message.finish_reason],
        "stop_sequence": None,
        "usage": anthropic_usage(message.usage),
    }
    return _encode(body)


def _content(block: ContentBlock) -> dict[str, Any] | None:
    match block:
        case TextBlock(text=text):
            return {"type": "text", "text": text}
        case ReasoningBlock(text=text, signature=sig, redacted=None):
            return {"type": "thinking", "thinking": text, "signature": sig or ""}
        case ReasoningBlock(redacted=data):
            return {"type": "redacted_thinking", "data": data}
        case ToolCallBlock(id=id_, name=name, arguments=args):
            return {"type": "tool_use", "id": id_, "name": name, "input": _input(args)}
        case ToolResultBlock() | ImageBlock():
            return None
        case _:
            assert_never(block)


def _input(arguments: str) -> Any:
    """The parsed arguments; a provider's invalid JSON is passed on as a string, not dropped."""
    try:
        return msgspec.json.decode(arguments or "{}")
    except msgspec.DecodeError:
        return arguments
