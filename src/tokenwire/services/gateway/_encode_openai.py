"""Normalised chunks to OpenAI Chat Completions: the streamed chunks, the completion, the error.

The stream encoder is fed chunks in ordinal order and returns SSE bytes to send (often empty).
Delta-less protocols are covered: a block whose content arrives only in ``block-end`` is sent
as one delta then. Reasoning goes out as ``delta.reasoning_content`` (DeepSeek's convention,
which OpenAI-compatible clients read and the official SDK keeps as an extra field).
"""

from __future__ import annotations

from typing import Any, assert_never

import msgspec

from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
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

_FINISH: dict[FinishReason, str] = {
    "stop": "stop",
    "tool-calls": "tool_calls",
    "max-tokens": "length",
    "content-filter": "content_filter",
    "refusal": "stop",
    "error": "stop",
    "aborted": "stop",
}
_encode = msgspec.json.encode
DONE = b"data: [DONE]\n\n"


def openai_usage(usage: TokenUsage) -> dict[str, Any]:
    """Disjoint counts folded back into OpenAI's totals (cache inside prompt, reasoning inside
    completion)."""
    cached = (usage.cache_read_tokens or 0) + (usage.cache_write_tokens or 0)
    prompt = (usage.input_tokens or 0) + cached
    completion = (usage.output_tokens or 0) + (usage.reasoning_tokens or 0)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read_tokens or 0},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens or 0},
    }


def openai_error_body(message: str, kind: str, *, param: str | None, code: str | None) -> bytes:
    """OpenAI's error object, the body of every error on ``/v1/chat/completions``."""
    return _encode({"error": {"message": message, "type": kind, "param": param, "code": code}})


def openai_stream_error(message: str, kind: str) -> bytes:
    """The in-stream error event the OpenAI SDK raises ``APIError`` on."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return b"data: " + _encode(body) + b"\n\n"


class OpenAIStreamEncoder:
    """Encodes one step's chunks as ``chat.completion.chunk`` server-sent events."""

    def __init__(self, *, completion_id: str, model: str, created: int, include_usage: bool):
        self._base: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
        }
        self._include_usage = include_usage
        self._tool_slot: dict[int, int] = {}
        self._streamed: set[int] = set()
        self._usage: TokenUsage | None = None

    def start(self) -> bytes:
        """The opening chunk announcing the assistant role."""
        return self._delta({"role": "assistant", "content": ""})

    def encode(self, chunk: StreamChunk) -> bytes:
        """The SSE bytes for ``chunk`` (``b""`` when it has no OpenAI counterpart)."""
        match chunk:
            case BlockStart():
                return b""
            case Usage(usage=usage):
                self._usage = usage
                return b""
            case TextDelta(index=index, text=text):
                self._streamed.add(index)
                return self._delta({"content": text}) if text else b""
            case ReasoningDelta(index=index, text=text):
                self._streamed.add(index)
                return self._delta({"reasoning_content": text}) if text else b""
            case ToolCallDelta():
                self._streamed.add(chunk.index)
                return self._tool_delta(chunk)
            case BlockEnd(index=index, block=block):
                return b"" if index in self._streamed else self._whole_block(index, block)
            case Finish():
                return self._finish(chunk)
            case _:
                assert_never(chunk)

    def _tool_delta(self, chunk: ToolCallDelta) -> bytes:
        first = chunk.index not in self._tool_slot
        slot = self._tool_slot.setdefault(chunk.index, len(self._tool_slot))
        call: dict[str, Any] = {"index": slot, "function": {"arguments": chunk.arguments_delta}}
        if first:
            call.update(id=chunk.id, type="function")
            call["function"]["name"] = chunk.name or ""
        return self._delta({"tool_calls": [call]})

    def _whole_block(self, index: int, block: ContentBlock) -> bytes:
        match block:
            case TextBlock(text=text):
                return self._delta({"content": text})
            case ReasoningBlock(text=text):
                return self._delta({"reasoning_content": text}) if text else b""
            case ToolCallBlock(id=id_, name=name, arguments=args):
                return self._tool_delta(ToolCallDelta(index, id_, name, args))
            case ToolResultBlock() | ImageBlock():
                return b""
            case _:
                assert_never(block)

    def _finish(self, chunk: Finish) -> bytes:
        if chunk.reason in ("error", "aborted"):
            message = chunk.error.message if chunk.error else "the step was aborted"
            return openai_stream_error(message, "api_error")
        out = self._event(self._choice({}, _FINISH[chunk.reason]))
        if self._include_usage and self._usage is not None:
            out += self._event({"choices": [], "usage": openai_usage(self._usage)})
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return self._event(self._choice(delta, None))

    @staticmethod
    def _choice(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {"choices": [choice]}

    def _event(self, fields: dict[str, Any]) -> bytes:
        return b"data: " + _encode(self._base | fields) + b"\n\n"


def openai_completion(message: Message, *, completion_id: str, model: str, created: int) -> bytes:
    """The non-streaming ``chat.completion`` object for a folded message."""
    reply: dict[str, Any] = {"role": "assistant", "content": message.text or None, "refusal": None}
    reasoning = "".join(b.text for b in message.content if isinstance(b, ReasoningBlock))
    if reasoning:
        reply["reasoning_content"] = reasoning
    if message.tool_calls:
        reply["tool_calls"] = [_call(c) for c in message.tool_calls]
    choice = {"index": 0, "message": reply, "logprobs": None}
    choice["finish_reason"] = _FINISH[message.finish_reason]
    body: dict[str, Any] = {"id": completion_id, "object": "chat.completion", "created": created}
    body.update(model=model, choices=[choice])
    if message.usage is not None:
        body["usage"] = openai_usage(message.usage)
    return _encode(body)


def _call(c: ToolCallBlock) -> dict[str, Any]:
    return {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
