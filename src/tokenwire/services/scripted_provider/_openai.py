"""Rendering a script in OpenAI's Chat Completions wire format (with DeepSeek's reasoning)."""

from __future__ import annotations

from typing import Any

import msgspec

from tokenwire.services.scripted_provider._actions import Frame
from tokenwire.services.scripted_provider._script import ProviderFailure, Script, ScriptedToolCall

FINISH_REASONS = {"stop": "stop", "tool-calls": "tool_calls", "max-tokens": "length"}
"""OpenAI's finish_reason for each ending that completes a step."""

_encode = msgspec.json.encode
FINGERPRINT = "fp_scripted"


def sse(payload: Any) -> bytes:
    """One ``data:`` event, compact JSON like OpenAI's."""
    return b"data: " + _encode(payload) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def usage(script: Script) -> dict[str, Any]:
    """Usage: one completion token per fragment; reasoning fragments reported separately."""
    completion = script.fragment_count
    out: dict[str, Any] = {
        "prompt_tokens": script.input_tokens,
        "completion_tokens": completion,
        "total_tokens": script.input_tokens + completion,
    }
    if script.reasoning:
        out["completion_tokens_details"] = {"reasoning_tokens": len(script.reasoning)}
    return out


def error_object(failure: ProviderFailure) -> dict[str, Any]:
    """OpenAI's error object (``type`` and ``code`` equal, as in ``insufficient_quota``)."""
    code = failure.openai_code
    return {"error": {"message": failure.message, "type": code, "param": None, "code": code}}


class OpenAIRenderer:
    """Renders one script as a ``chat.completion.chunk`` stream or a ``chat.completion``."""

    def __init__(self, script: Script, *, model: str, created: int, include_usage: bool) -> None:
        self.script = script
        self.model = model
        self.created = created
        self.include_usage = include_usage

    def frames(self) -> list[Frame]:
        """The complete stream, as if it ended normally."""
        s = self.script
        frames = [self._frame({"role": "assistant", "content": ""})]
        frames += [
            self._frame({"content": None, "reasoning_content": r}, True) for r in s.reasoning
        ]
        frames += [self._frame({"content": t}, True) for t in s.text]
        frames += self._tool_frames()
        finish = FINISH_REASONS.get(s.ending, "stop")
        frames.append(self._frame({}, finish_reason=finish))
        if self.include_usage:
            frames.append(Frame(sse({**self._head(), "choices": [], "usage": usage(s)})))
        frames.append(Frame(DONE))
        return frames

    def error_frame(self) -> bytes:
        """The in-band error chunk OpenRouter and Groq send mid-stream."""
        assert self.script.failure is not None
        return sse(error_object(self.script.failure))

    def body(self) -> bytes:
        """The non-streaming ``chat.completion`` object."""
        s = self.script
        message: dict[str, Any] = {"role": "assistant", "content": "".join(s.text) or None}
        if s.reasoning:
            message["reasoning_content"] = "".join(s.reasoning)
        if s.tool_calls:
            message["tool_calls"] = [_full_call(c) for c in s.tool_calls]
        message["refusal"] = None
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": FINISH_REASONS.get(s.ending, "stop"),
        }
        head = {**self._head(), "object": "chat.completion"}
        return _encode({**head, "choices": [choice], "usage": usage(s)})

    def _head(self) -> dict[str, Any]:
        return {
            "id": self.script.message_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": FINGERPRINT,
        }

    def _frame(
        self, delta: dict[str, Any], fragment: bool = False, finish_reason: str | None = None
    ) -> Frame:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        chunk = {**self._head(), "choices": [choice]}
        if self.include_usage:
            chunk["usage"] = None
        return Frame(sse(chunk), fragment)

    def _tool_frames(self) -> list[Frame]:
        """Headers of every call, then argument fragments interleaved across indexes 0,1,0,1."""
        calls = self.script.tool_calls
        frames = [self._frame({"tool_calls": [_header(i, c)]}) for i, c in enumerate(calls)]
        longest = max((len(c.fragments) for c in calls), default=0)
        for j in range(longest):
            for i, call in enumerate(calls):
                if j < len(call.fragments):
                    delta = {"index": i, "function": {"arguments": call.fragments[j]}}
                    frames.append(self._frame({"tool_calls": [delta]}, True))
        return frames


def _header(index: int, call: ScriptedToolCall) -> dict[str, Any]:
    function = {"name": call.name, "arguments": ""}
    return {"index": index, "id": call.id, "type": "function", "function": function}


def _full_call(call: ScriptedToolCall) -> dict[str, Any]:
    function = {"name": call.name, "arguments": call.arguments}
    return {"id": call.id, "type": "function", "function": function}
