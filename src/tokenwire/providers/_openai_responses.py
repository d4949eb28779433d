"""OpenAI Responses API SSE events -> stream chunks.

Mapping (see docs/providers.md): each output item becomes blocks in arrival order.
``message`` items: one text block per ``output_text`` / ``refusal`` content part.
``reasoning`` items: one reasoning block each; its summary parts (``reasoning_summary_text``)
and raw ``reasoning_text`` deltas are its text, parts separated by a blank line; the item's
``encrypted_content`` (final value, from ``output_item.done``) is ``ReasoningBlock.redacted``.
``function_call`` items: one tool-call block (``call_id``, ``name`` from ``output_item.added``).
Server-side tool items (``web_search_call``, ...) produce no block: nothing for the caller to run.

The step ends at ``response.completed`` / ``response.incomplete`` (normal finish, with usage),
``response.failed`` or ``error`` (``finish {error}``). ``replay_state`` carries the response id
and the reasoning item ids, which the Responses API needs to be sent back.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from tokenwire.providers._builder import BlockBuilder, step_error
from tokenwire.providers._errors import is_retryable
from tokenwire.providers._openai_chat import ENDED_EARLY, chat_usage
from tokenwire.schemas import Finish, FinishReason, StepError, StreamChunk, TokenUsage, Usage
from tokenwire.sse import SseEvent

__all__ = ["OpenAIResponsesNormaliser"]

_SUMMARY_SEPARATOR: Final = "\n\n"
_INCOMPLETE: Final[dict[str, FinishReason]] = {
    "max_output_tokens": "max-tokens",
    "content_filter": "content-filter",
}


class _Item(msgspec.Struct):
    type: str = ""
    id: str | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    encrypted_content: str | None = None


class _Part(msgspec.Struct):
    type: str = ""


class _Error(msgspec.Struct):
    message: str = ""
    code: str | None = None
    type: str | None = None


class _InputDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _OutputDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class _Usage(msgspec.Struct):
    input_tokens: int | None = None
    output_tokens: int | None = None
    input_tokens_details: _InputDetails | None = None
    output_tokens_details: _OutputDetails | None = None


class _Incomplete(msgspec.Struct):
    reason: str | None = None


class _Response(msgspec.Struct):
    id: str | None = None
    usage: _Usage | None = None
    incomplete_details: _Incomplete | None = None
    error: _Error | None = None


class _Event(msgspec.Struct):
    """Every Responses stream event, flattened: each type fills the fields it has."""

    type: str = ""
    output_index: int = 0
    content_index: int = 0
    summary_index: int = 0
    delta: str | None = None
    item: _Item | None = None
    part: _Part | None = None
    response: _Response | None = None
    error: _Error | None = None
    code: str | None = None  # older "error" events put the fields at the top level
    message: str | None = None


class _TypeOnly(msgspec.Struct):
    type: str = ""


_event_decoder: Final = msgspec.json.Decoder(_Event)
_type_decoder: Final = msgspec.json.Decoder(_TypeOnly)
_ITEM: Final = -1
# Event types this normaliser reads: one of them undecodable is a protocol failure.
_READ_PREFIXES: Final = (
    "response.output",
    "response.function",
    "response.reasoning",
    "response.content",
    "response.refusal",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "error",
)  # content_index of the blocks keyed by a whole output item


def _usage(raw: _Usage) -> TokenUsage:
    cached = raw.input_tokens_details.cached_tokens if raw.input_tokens_details else None
    details = raw.output_tokens_details
    reasoning = details.reasoning_tokens if details is not None else None
    return chat_usage(raw.input_tokens, raw.output_tokens, cached, reasoning)


def _error(raw: _Error | None, fallback: str) -> StepError:
    if raw is None:
        return step_error(fallback, False, None)
    code = raw.code or raw.type
    return step_error(raw.message or fallback, is_retryable(None, code), code)


class OpenAIResponsesNormaliser:
    """Responses API SSE events -> :data:`StreamChunk` (implements ``Normaliser``)."""

    __slots__ = (
        "_blocks",
        "_done",
        "_keys",
        "_reasoning_ids",
        "_refused",
        "_response_id",
        "_summary_at",
    )

    def __init__(self) -> None:
        self._blocks = BlockBuilder()
        self._keys: dict[tuple[int, int], int] = {}  # (output_index, content_index) -> block
        self._summary_at: dict[int, int] = {}  # reasoning block -> last summary_index seen
        self._reasoning_ids: list[str] = []
        self._response_id: str | None = None
        self._refused = False
        self._done = False

    def feed(self, event: SseEvent) -> list[StreamChunk]:
        """Normalise one SSE event; nothing once the step has finished."""
        if self._done:
            return []
        try:
            decoded = _event_decoder.decode(event.data)
        except msgspec.DecodeError as exc:
            return self._undecodable(event.data, exc)
        out: list[StreamChunk] = []
        self._dispatch(decoded, out)
        return out

    def close(self) -> list[StreamChunk]:
        """End of the body: ``finish {error}`` unless a terminal event already finished it."""
        if self._done:
            return []
        return self._terminal(
            None, Finish(reason="error", error=step_error(ENDED_EARLY, True, None))
        )

    def _undecodable(self, data: str, exc: msgspec.DecodeError) -> list[StreamChunk]:
        try:
            kind = _type_decoder.decode(data).type
        except msgspec.DecodeError:
            kind = "error"
        if not kind.startswith(_READ_PREFIXES):
            return []  # an event we do not read, with a shape we do not know: harmless
        message = f"undecodable {kind} event from provider: {exc}"
        return self._terminal(None, Finish(reason="error", error=step_error(message, False, None)))

    def _dispatch(self, ev: _Event, out: list[StreamChunk]) -> None:
        match ev.type:
            case "response.created" | "response.in_progress":
                if ev.response is not None and ev.response.id:
                    self._response_id = ev.response.id
            case "response.output_item.added":
                self._item_added(ev, out)
            case "response.output_item.done":
                self._item_done(ev, out)
            case "response.content_part.added":
                if ev.part is not None and ev.part.type in ("output_text", "refusal"):
                    self._text_block(ev, out)
            case "response.output_text.delta" | "response.refusal.delta":
                self._refused |= ev.type == "response.refusal.delta"
                self._fragment(self._text_block(ev, out), ev.delta, out)
            case "response.content_part.done":
                self._close((ev.output_index, ev.content_index), out)
            case "response.reasoning_summary_text.delta" | "response.reasoning_text.delta":
                self._reasoning_delta(ev, out)
            case "response.function_call_arguments.delta":
                self._arguments(ev, out)
            case "response.completed" | "response.incomplete" | "response.failed" | "error":
                out += self._end(ev)
            case _:
                pass  # lifecycle and server-tool progress events carry nothing to normalise

    def _item_added(self, ev: _Event, out: list[StreamChunk]) -> None:
        item = ev.item or _Item()
        key = (ev.output_index, _ITEM)
        if item.type == "reasoning":
            self._keys[key] = self._blocks.open("reasoning", out)
            if item.id:
                self._reasoning_ids.append(item.id)
        elif item.type == "function_call":
            call_id = item.call_id or item.id or f"call_{ev.output_index}"
            index = self._blocks.open("tool-call", out, call_id, item.name or "")
            self._keys[key] = index
            out.append(self._blocks.arguments(index, item.arguments or "", with_name=True))

    def _item_done(self, ev: _Event, out: list[StreamChunk]) -> None:
        item = ev.item or _Item()
        index = self._keys.get((ev.output_index, _ITEM))
        if index is not None and self._blocks.is_open(index):
            if item.type == "reasoning":
                self._blocks.set_redacted(index, item.encrypted_content)
            elif (
                item.type == "function_call"
                and item.arguments
                and not self._blocks.assembled(index)
            ):
                # Servers that send the arguments only whole: pass them on as one fragment.
                out.append(self._blocks.arguments(index, item.arguments))
        for key in [k for k in self._keys if k[0] == ev.output_index]:
            self._close(key, out)

    def _text_block(self, ev: _Event, out: list[StreamChunk]) -> int:
        key = (ev.output_index, ev.content_index)
        index = self._keys.get(key)
        if index is None:
            index = self._keys[key] = self._blocks.open("text", out)
        return index

    def _reasoning_delta(self, ev: _Event, out: list[StreamChunk]) -> None:
        key = (ev.output_index, _ITEM)
        index = self._keys.get(key)
        if index is None:  # a reasoning delta without its output_item.added
            index = self._keys[key] = self._blocks.open("reasoning", out)
        previous = self._summary_at.setdefault(index, ev.summary_index)
        if ev.summary_index != previous:
            self._summary_at[index] = ev.summary_index
            out.append(self._blocks.text(index, _SUMMARY_SEPARATOR))
        self._fragment(index, ev.delta, out)

    def _arguments(self, ev: _Event, out: list[StreamChunk]) -> None:
        index = self._keys.get((ev.output_index, _ITEM))
        if index is not None and self._blocks.is_open(index) and ev.delta:
            out.append(self._blocks.arguments(index, ev.delta))

    def _fragment(self, index: int, text: str | None, out: list[StreamChunk]) -> None:
        if text and self._blocks.is_open(index):
            out.append(self._blocks.text(index, text))

    def _close(self, key: tuple[int, int], out: list[StreamChunk]) -> None:
        index = self._keys.get(key)
        if index is not None:
            self._blocks.close(index, out)

    def _end(self, ev: _Event) -> list[StreamChunk]:
        response = ev.response or _Response()
        self._response_id = response.id or self._response_id
        usage = _usage(response.usage) if response.usage is not None else None
        if ev.type == "error":
            top = _Error(message=ev.message or "", code=ev.code) if ev.code or ev.message else None
            error = _error(ev.error or top, "provider reported an error")
            return self._terminal(usage, Finish(reason="error", error=error))
        if ev.type == "response.failed":
            error = _error(response.error, "response failed")
            return self._terminal(usage, Finish(reason="error", error=error))
        return self._normal_end(ev.type, response, usage)

    def _normal_end(
        self, kind: str, response: _Response, usage: TokenUsage | None
    ) -> list[StreamChunk]:
        reason: FinishReason = "stop"
        if kind == "response.incomplete":
            why = response.incomplete_details.reason if response.incomplete_details else None
            if why not in _INCOMPLETE:
                error = step_error(f"response incomplete: {why}", False, why)
                return self._terminal(usage, Finish(reason="error", error=error))
            reason = _INCOMPLETE[why]
        elif self._blocks.has_tool_calls:
            reason = "tool-calls"
        elif self._refused:
            reason = "refusal"
        out: list[StreamChunk] = []
        if reason != "max-tokens":  # a truncated answer's open blocks were cut: left open
            self._blocks.close_all(out)
        return out + self._terminal(usage, Finish(reason=reason, replay_state=self._replay_state()))

    def _replay_state(self) -> dict[str, Any] | None:
        state: dict[str, Any] = {}
        if self._response_id:
            state["response_id"] = self._response_id
        if self._reasoning_ids:
            state["reasoning_item_ids"] = list(self._reasoning_ids)
        return state or None

    def _terminal(self, usage: TokenUsage | None, finish: Finish) -> list[StreamChunk]:
        self._done = True
        if usage is None:
            return [finish]
        return [Usage(usage=usage), finish]
