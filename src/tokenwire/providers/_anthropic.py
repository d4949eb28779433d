"""Anthropic Messages streaming (``POST /v1/messages``, ``stream: true``) -> stream chunks.

``content_block_*`` events become blocks with dense indexes (text, reasoning with its
signature, redacted thinking, client tool calls); every block Anthropic runs or makes itself
(server tools and their results, MCP, compaction, future types) emits no chunk and is kept,
verbatim and in place, in ``finish.replay_state["opaque_blocks"]`` so that the conversation
can continue. ``message_delta`` carries the stop reason and cumulative usage (disjoint
already: ``input_tokens`` excludes the cache); ``message_stop`` ends the step with one usage
and one finish; ``event: error`` ends it with ``finish {error}``. The mapping, event by event:
docs/providers.md, "Anthropic".
"""

from __future__ import annotations

from typing import Any, Final, Literal, assert_never

import msgspec

from tokenwire.providers._errors import is_retryable
from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    Finish,
    FinishReason,
    ReasoningBlock,
    ReasoningDelta,
    StepError,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallBlock,
    ToolCallDelta,
    Usage,
)
from tokenwire.sse import SseEvent

__all__ = ["AnthropicNormaliser"]

# --- the provider's wire format, decoded once (unknown fields ignored) ----------------------


class _OutputDetails(msgspec.Struct, frozen=True):
    thinking_tokens: int | None = None


class _Iteration(msgspec.Struct, frozen=True):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None


class _Usage(msgspec.Struct, frozen=True):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    output_tokens_details: _OutputDetails | None = None
    iterations: list[_Iteration] | None = None


class _MessageHead(msgspec.Struct, frozen=True):
    usage: _Usage = _Usage()


class _BlockHead(msgspec.Struct, frozen=True):
    type: str
    text: str = ""
    thinking: str = ""
    signature: str = ""
    data: str = ""
    id: str = ""
    name: str = ""
    input: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"{}"))


class _Delta(msgspec.Struct, frozen=True):
    type: str
    text: str = ""
    thinking: str = ""
    signature: str = ""
    partial_json: str = ""
    content: str | None = None
    encrypted_content: str | None = None


class _StopDelta(msgspec.Struct, frozen=True):
    stop_reason: str | None = None


class _ErrorBody(msgspec.Struct, frozen=True):
    type: str = "error"
    message: str = ""


class _MessageStart(msgspec.Struct, tag="message_start", frozen=True):
    message: _MessageHead


class _ContentBlockStart(msgspec.Struct, tag="content_block_start", frozen=True):
    index: int
    content_block: msgspec.Raw


class _ContentBlockDelta(msgspec.Struct, tag="content_block_delta", frozen=True):
    index: int
    delta: _Delta


class _ContentBlockStop(msgspec.Struct, tag="content_block_stop", frozen=True):
    index: int


class _MessageDelta(msgspec.Struct, tag="message_delta", frozen=True):
    delta: _StopDelta = _StopDelta()
    usage: _Usage | None = None


class _MessageStop(msgspec.Struct, tag="message_stop", frozen=True):
    pass


class _Error(msgspec.Struct, tag="error", frozen=True):
    error: _ErrorBody = _ErrorBody()


class _Ping(msgspec.Struct, tag="ping", frozen=True):
    pass


_Event = (
    _Ping
    | _MessageStart
    | _ContentBlockStart
    | _ContentBlockDelta
    | _ContentBlockStop
    | _MessageDelta
    | _MessageStop
    | _Error
)
_EVENT_NAMES: Final = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "error",
        "message",  # an unnamed event: decode it by its "type"
    }
)
_event_decoder: Final = msgspec.json.Decoder(_Event)
_head_decoder: Final = msgspec.json.Decoder(_BlockHead)
_dict_decoder: Final = msgspec.json.Decoder(dict[str, Any])
_any_decoder: Final = msgspec.json.Decoder()

_STOP_REASONS: Final[dict[str, FinishReason]] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool-calls",
    "max_tokens": "max-tokens",
    # The output was cut by the context window: as unsafe to dispatch as a max_tokens cut.
    "model_context_window_exceeded": "max-tokens",
    "refusal": "refusal",
    # A server-tool loop paused; the turn is complete so far and the client re-sends it (with
    # the opaque blocks) to let Claude continue. Not an error and nothing to dispatch.
    "pause_turn": "stop",
}
MAX_OPEN_BLOCKS: Final = 256
"""Blocks open at once before the step fails with ``finish {error, code="limit_exceeded"}``."""
MAX_STEP_CHARS: Final = 64 * 1024 * 1024
"""Characters accumulated per step before it fails the same way (a runaway stream)."""

_Kind = Literal["text", "reasoning", "redacted", "tool", "opaque"]
_KIND_OF_TYPE: Final[dict[str, _Kind]] = {
    "text": "text",
    "thinking": "reasoning",
    "redacted_thinking": "redacted",
    "tool_use": "tool",
}


class _Open:
    """One content block between its start and stop events; ``index`` is ours (-1: opaque)."""

    __slots__ = ("head", "index", "kind", "parts", "raw", "signature")

    def __init__(
        self, index: int, kind: _Kind, head: _BlockHead, raw: dict[str, Any] | None
    ) -> None:
        self.index = index
        self.kind: _Kind = kind
        self.head = head
        self.raw = raw  # the verbatim block, for opaque kinds only
        self.parts: list[str] = []
        self.signature = head.signature


class _ProtocolError(Exception):
    """Internal: the stream broke the protocol; carries the step error to finish with."""

    def __init__(self, error: StepError) -> None:
        super().__init__(error.message)
        self.error = error


class AnthropicNormaliser:
    """Anthropic Messages SSE events -> stream chunks (implements ``Normaliser``).

    One instance per step. ``feed`` each :class:`SseEvent` in order, then ``close`` at the end
    of the body. After ``message_stop`` (or an error) the step is finished and further events
    are ignored. Example::

        n = AnthropicNormaliser()
        chunks = [c for ev in events for c in n.feed(ev)] + n.close()
        # ..., BlockEnd(0, TextBlock("Hello")), Usage(...), Finish("stop")
    """

    def __init__(self) -> None:
        self._open: dict[int, _Open] = {}  # by Anthropic's index (its content position)
        self._next_index = 0
        self._opaque: list[dict[str, Any]] = []
        self._usage: _UsageAcc | None = None
        self._stop_reason: str | None = None
        self._chars = 0
        self._finished = False

    def feed(self, event: SseEvent) -> list[StreamChunk]:
        """The chunks this event completes; ``[]`` for ping and unknown event types."""
        if self._finished or event.event not in _EVENT_NAMES:
            return []
        try:
            return self._dispatch(_event_decoder.decode(event.data))
        except msgspec.DecodeError as exc:
            error = StepError(f"undecodable Anthropic event {event.event!r}: {exc}", False, None)
            return self._fail(error)
        except _ProtocolError as failed:
            return self._fail(failed.error)

    def close(self) -> list[StreamChunk]:
        """End of the body: ``finish {error}`` unless ``message_stop`` already finished it."""
        if self._finished:
            return []
        message = "stream ended before the provider finished (no message_stop)"
        return self._fail(StepError(message, retryable=True, code="stream_truncated"))

    def _dispatch(self, event: _Event) -> list[StreamChunk]:
        match event:
            case _Ping():  # only reaches here unnamed; named pings are skipped unparsed
                return []
            case _MessageStart(message=message):
                self._usage = _UsageAcc(message.usage)
                return []
            case _ContentBlockStart(index=index, content_block=raw):
                return self._start(index, raw)
            case _ContentBlockDelta(index=index, delta=delta):
                return self._delta(self._block(index), delta)
            case _ContentBlockStop(index=index):
                return self._stop(index)
            case _MessageDelta(delta=delta, usage=usage):
                self._stop_reason = delta.stop_reason or self._stop_reason
                if usage is not None:
                    self._usage_acc().merge(usage)
                return []
            case _MessageStop():
                return self._finish()
            case _Error(error=body):
                # overloaded_error, api_error, rate_limit_error, timeout_error: retryable.
                retryable = is_retryable(code=body.type)
                return self._fail(StepError(body.message or body.type, retryable, body.type))
            case _:
                assert_never(event)

    def _start(self, position: int, raw: msgspec.Raw) -> list[StreamChunk]:
        if position in self._open:
            raise _ProtocolError(_protocol(f"content block {position} started twice"))
        if len(self._open) >= MAX_OPEN_BLOCKS:
            raise _ProtocolError(StepError("too many open content blocks", False, "limit_exceeded"))
        head = _head_decoder.decode(raw)
        kind = _KIND_OF_TYPE.get(head.type, "opaque")
        opaque = _dict_decoder.decode(raw) if kind == "opaque" else None
        # Our indexes are dense (0, 1, 2, ...) over the blocks we emit; opaque blocks keep
        # Anthropic's index as their position in the replay state instead.
        index = -1 if opaque is not None else self._next_index
        self._next_index += opaque is None
        block = self._open[position] = _Open(index, kind, head, opaque)
        match kind:
            case "text":
                return [BlockStart(index, "text"), *self._text(block, head.text)]
            case "reasoning":
                return [BlockStart(index, "reasoning"), *self._text(block, head.thinking)]
            case "redacted":
                return [BlockStart(index, "reasoning")]
            case "tool":
                return [BlockStart(index, "tool-call"), ToolCallDelta(index, head.id, head.name)]
            case "opaque":
                return []
            case _:
                assert_never(kind)

    def _delta(self, block: _Open, delta: _Delta) -> list[StreamChunk]:
        # A delta of a type that does not belong to its block is ignored, as the SDK does.
        match delta.type:
            case "text_delta" if block.kind == "text":
                return self._text(block, delta.text)
            case "thinking_delta" if block.kind == "reasoning":
                return self._text(block, delta.thinking)
            case "signature_delta" if block.kind == "reasoning":
                block.signature = delta.signature  # sent whole, once, just before the stop
                return []
            case "input_json_delta" if block.kind in ("tool", "opaque"):
                return self._json(block, delta.partial_json)
            case "compaction_delta" if block.raw is not None:
                # A compaction delta carries the whole summary (the SDK assigns, not appends).
                block.raw["content"] = delta.content
                if delta.encrypted_content is not None:
                    block.raw["encrypted_content"] = delta.encrypted_content
                return []
            case _:  # citations_delta (no citation field in our blocks) and future types
                return []

    def _text(self, block: _Open, text: str) -> list[StreamChunk]:
        if not text:  # empty fragments (e.g. a trailing thinking_delta "") carry nothing
            return []
        self._charge(text)
        block.parts.append(text)
        if block.kind == "text":
            return [TextDelta(block.index, text)]
        return [ReasoningDelta(block.index, text)]

    def _json(self, block: _Open, fragment: str) -> list[StreamChunk]:
        if not fragment:  # the first input_json_delta is usually ""
            return []
        self._charge(fragment)
        block.parts.append(fragment)
        if block.kind == "opaque":
            return []
        return [ToolCallDelta(block.index, block.head.id, arguments_delta=fragment)]

    def _stop(self, position: int) -> list[StreamChunk]:
        block = self._block(position)
        del self._open[position]
        index, text = block.index, "".join(block.parts)
        match block.kind:
            case "text":
                return [BlockEnd(index, TextBlock(text))]
            case "reasoning":
                return [BlockEnd(index, ReasoningBlock(text, signature=block.signature or None))]
            case "redacted":
                return [BlockEnd(index, ReasoningBlock("", redacted=block.head.data))]
            case "tool":
                return self._tool_end(block, index, text)
            case "opaque":
                self._opaque.append({"position": position, "block": self._assemble(block, text)})
                return []
            case _:
                assert_never(block.kind)

    def _tool_end(self, block: _Open, index: int, arguments: str) -> list[StreamChunk]:
        head = block.head
        if arguments:
            return [BlockEnd(index, ToolCallBlock(head.id, head.name, arguments))]
        # No input fragments at all, or only "": a tool without parameters. Anthropic's SDK
        # then keeps the block's initial ``input`` ({} in every stream), so the arguments are
        # that object's JSON ("{}"), never "", which no tool could parse. One delta carries it
        # so that the deltas of a block always concatenate to its block-end arguments.
        arguments = bytes(head.input).decode()
        return [
            ToolCallDelta(index, head.id, arguments_delta=arguments),
            BlockEnd(index, ToolCallBlock(head.id, head.name, arguments)),
        ]

    def _assemble(self, block: _Open, input_json: str) -> dict[str, Any]:
        raw = block.raw if block.raw is not None else {}
        if input_json:
            try:
                raw["input"] = _any_decoder.decode(input_json)
            except msgspec.DecodeError as exc:
                raise _ProtocolError(
                    _protocol(f"undecodable {block.head.type} input: {exc}")
                ) from exc
        return raw

    def _finish(self) -> list[StreamChunk]:
        if self._stop_reason is None:
            raise _ProtocolError(_protocol("message_stop without a stop_reason"))
        reason = _STOP_REASONS.get(self._stop_reason, "stop")
        if self._open and reason != "max-tokens":
            raise _ProtocolError(_protocol(f"message_stop with open blocks {sorted(self._open)}"))
        # A truncating stop may leave blocks open (no content_block_stop): they stay open, and
        # the fold keeps their text and reasoning as they stand and drops their tool calls. An
        # open opaque block (a cut server tool call) is not complete enough to send back.
        self._open.clear()
        state: dict[str, Any] = {}
        if self._opaque:
            state["opaque_blocks"] = self._opaque
        if self._stop_reason not in _STOP_REASONS or self._stop_reason == "pause_turn":
            state["stop_reason"] = self._stop_reason  # the caller must see it to act on it
        self._finished = True
        usage = self._usage_acc().token_usage()
        return [Usage(usage), Finish(reason, replay_state=state or None)]

    def _fail(self, error: StepError) -> list[StreamChunk]:
        """End the step with ``finish {error}``, after the usage seen so far (if any)."""
        self._finished = True
        usage = [] if self._usage is None else [Usage(self._usage.token_usage())]
        return [*usage, Finish("error", error=error)]

    def _block(self, position: int) -> _Open:
        block = self._open.get(position)
        if block is None:
            message = f"event for content block {position}, which is not open"
            raise _ProtocolError(_protocol(message))
        return block

    def _usage_acc(self) -> _UsageAcc:
        if self._usage is None:
            raise _ProtocolError(_protocol("usage before message_start"))
        return self._usage

    def _charge(self, text: str) -> None:
        self._chars += len(text)
        if self._chars > MAX_STEP_CHARS:
            raise _ProtocolError(StepError("step exceeds MAX_STEP_CHARS", False, "limit_exceeded"))


class _UsageAcc:
    """The latest usage: ``message_start``'s, overwritten by each ``message_delta`` field sent.

    ``message_delta`` counts are cumulative totals, so they replace (the last wins); a field it
    omits keeps the ``message_start`` value, exactly as the SDK's accumulator does.
    """

    __slots__ = ("details", "fields", "iterations")

    _NAMES: Final = (
        "input_tokens",
        "output_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    )

    def __init__(self, usage: _Usage) -> None:
        self.fields: dict[str, int | None] = dict.fromkeys(self._NAMES)
        self.details: _OutputDetails | None = None
        self.iterations: list[_Iteration] | None = None
        self.merge(usage)

    def merge(self, usage: _Usage) -> None:
        for name in self._NAMES:
            value = getattr(usage, name)
            if value is not None:
                self.fields[name] = value
        self.details = usage.output_tokens_details or self.details
        self.iterations = usage.iterations or self.iterations

    def token_usage(self) -> TokenUsage:
        """Disjoint usage. With compaction, the top-level counts cover only the final sampling
        iteration; ``iterations`` lists every one (the compaction summary too), and what was
        billed is their sum, so that sum is reported."""
        counts = self.fields if not self.iterations else _sum_iterations(self.iterations)
        output = counts["output_tokens"]
        reasoning = self.details.thinking_tokens if self.details is not None else None
        if output is not None and reasoning is not None:
            output -= reasoning  # output_tokens includes thinking; ours excludes it
        return TokenUsage(
            input_tokens=counts["input_tokens"],
            output_tokens=output,
            cache_read_tokens=counts["cache_read_input_tokens"],
            cache_write_tokens=counts["cache_creation_input_tokens"],
            reasoning_tokens=reasoning,
        )


def _sum_iterations(iterations: list[_Iteration]) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for name in _UsageAcc._NAMES:
        values = [v for it in iterations if (v := getattr(it, name)) is not None]
        out[name] = sum(values) if values else None
    return out


def _protocol(message: str) -> StepError:
    return StepError(message, retryable=False, code="protocol_error")
