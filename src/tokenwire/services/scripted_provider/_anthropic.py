"""Rendering a script in Anthropic's Messages wire format."""

from __future__ import annotations

from typing import Any

import msgspec

from tokenwire.services.scripted_provider._actions import Frame
from tokenwire.services.scripted_provider._script import ProviderFailure, Script, ScriptedToolCall

STOP_REASONS = {"stop": "end_turn", "tool-calls": "tool_use", "max-tokens": "max_tokens"}
"""Anthropic's stop_reason for each ending that completes a step."""

_encode = msgspec.json.encode


def sse(event: str, payload: Any) -> bytes:
    """One named event, ``event:`` line then ``data:`` line, as Anthropic frames them."""
    return b"event: " + event.encode() + b"\ndata: " + _encode(payload) + b"\n\n"


_PING = b'event: ping\ndata: {"type": "ping"}\n\n'  # spaced exactly as Anthropic sends it


def error_object(failure: ProviderFailure) -> dict[str, Any]:
    """Anthropic's error body, also the data of ``event: error``."""
    return {"type": "error", "error": {"type": failure.anthropic_type, "message": failure.message}}


class AnthropicRenderer:
    """Renders one script as a Messages event stream or a ``message`` object."""

    def __init__(self, script: Script, *, model: str) -> None:
        self.script = script
        self.model = model
        self._index = 0

    def frames(self) -> list[Frame]:
        """The complete stream, as if it ended normally; blocks are sequential by nature."""
        s = self.script
        self._index = 0
        start = {**self._message([]), "usage": {"input_tokens": s.input_tokens, "output_tokens": 1}}
        frames = [Frame(sse("message_start", {"type": "message_start", "message": start}))]
        if s.reasoning:
            frames += self._thinking_block()
        if s.text:
            frames += self._text_block()
        for call in s.tool_calls:
            frames += self._tool_block(call)
        delta = {"stop_reason": STOP_REASONS.get(s.ending, "end_turn"), "stop_sequence": None}
        usage = {"output_tokens": s.fragment_count}
        frames.append(
            Frame(sse("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
        )
        frames.append(Frame(sse("message_stop", {"type": "message_stop"})))
        return frames

    def error_frame(self) -> bytes:
        """``event: error``, as Anthropic sends an overload mid-stream."""
        assert self.script.failure is not None
        return sse("error", error_object(self.script.failure))

    def body(self) -> bytes:
        """The non-streaming ``message``; a tool call cut by max-tokens is omitted."""
        s = self.script
        content: list[dict[str, Any]] = []
        if s.reasoning:
            content.append(
                {"type": "thinking", "thinking": "".join(s.reasoning), "signature": s.signature}
            )
        if s.text:
            content.append({"type": "text", "text": "".join(s.text)})
        if s.ending != "max-tokens":
            content += [_tool_use(c, msgspec.json.decode(c.arguments)) for c in s.tool_calls]
        usage = {"input_tokens": s.input_tokens, "output_tokens": s.fragment_count}
        return _encode({**self._message(content), "usage": usage})

    def _message(self, content: list[dict[str, Any]]) -> dict[str, Any]:
        stop = STOP_REASONS.get(self.script.ending, "end_turn") if content else None
        return {
            "id": self.script.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
        }

    def _open(self, block: dict[str, Any]) -> list[Frame]:
        self._index += 1
        start = {"type": "content_block_start", "index": self._index - 1, "content_block": block}
        frames = [Frame(sse("content_block_start", start))]
        return [*frames, Frame(_PING)] if self._index == 1 else frames

    def _delta(self, delta: dict[str, Any], fragment: bool = False) -> Frame:
        payload = {"type": "content_block_delta", "index": self._index - 1, "delta": delta}
        return Frame(sse("content_block_delta", payload), fragment)

    def _deltas(self, delta_type: str, field: str, fragments: tuple[str, ...]) -> list[Frame]:
        return [self._delta({"type": delta_type, field: f}, fragment=True) for f in fragments]

    def _stop(self) -> Frame:
        payload = {"type": "content_block_stop", "index": self._index - 1}
        return Frame(sse("content_block_stop", payload))

    def _thinking_block(self) -> list[Frame]:
        s = self.script
        frames = self._open({"type": "thinking", "thinking": "", "signature": ""})
        frames += self._deltas("thinking_delta", "thinking", s.reasoning)
        frames.append(self._delta({"type": "signature_delta", "signature": s.signature}))
        return [*frames, self._stop()]

    def _text_block(self) -> list[Frame]:
        frames = self._open({"type": "text", "text": ""})
        frames += self._deltas("text_delta", "text", self.script.text)
        return [*frames, self._stop()]

    def _tool_block(self, call: ScriptedToolCall) -> list[Frame]:
        frames = self._open(_tool_use(call, {}))
        frames.append(self._delta({"type": "input_json_delta", "partial_json": ""}))
        frames += self._deltas("input_json_delta", "partial_json", call.fragments)
        return [*frames, self._stop()]


def _tool_use(call: ScriptedToolCall, tool_input: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": tool_input}
