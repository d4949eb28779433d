"""Gemini ``streamGenerateContent?alt=sse`` -> stream chunks.

Each SSE event is a whole ``GenerateContentResponse`` for the newest slice of the answer; only
``candidates[0]`` is read (the gateway never asks for more). Consecutive text parts of one
kind are one block (plain text, or reasoning for ``"thought": true``); a ``functionCall`` part
arrives whole and becomes one tool call, whose id carries the part's thought signature
(:func:`signed_call_id`, read back by :func:`split_call_id`); every thought signature is also
kept in ``finish.replay_state["thought_signatures"]``. ``usageMetadata`` is cumulative (the
last wins). The mapping, field by field: docs/providers.md, "Gemini".
"""

from __future__ import annotations

import base64
import binascii
from typing import Any, Final, Literal

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

__all__ = ["GeminiNormaliser"]

# --- the provider's wire format, decoded once (unknown fields ignored) ----------------------


SIGNATURE_MARK: Final = "__thought__"
"""Separates a Gemini tool call's id from the thought signature it carries."""


def signed_call_id(call_id: str, signature: str | None) -> str:
    """``call_id`` carrying ``signature`` (standard base64 in, base64url without padding in the
    id, so the id stays letters, digits, ``-`` and ``_``), or ``call_id`` without one."""
    if not signature:
        return call_id
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return call_id  # not base64: Gemini's are; keep the id plain rather than guess
    return f"{call_id}{SIGNATURE_MARK}{base64.urlsafe_b64encode(raw).rstrip(b'=').decode()}"


def split_call_id(call_id: str) -> tuple[str, str | None]:
    """(the plain id, the thought signature in standard base64 or None) of a tool call id."""
    plain, mark, encoded = call_id.rpartition(SIGNATURE_MARK)
    if not mark or not encoded:
        return call_id, None
    try:
        raw = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    except (binascii.Error, ValueError):
        return call_id, None
    return plain, base64.b64encode(raw).decode()


class _FunctionCall(msgspec.Struct, frozen=True):
    name: str
    args: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"{}"))
    id: str | None = None


class _Part(msgspec.Struct, frozen=True, rename="camel"):
    text: str | None = None
    thought: bool = False
    thought_signature: str | None = None
    function_call: _FunctionCall | None = None


class _Content(msgspec.Struct, frozen=True):
    parts: list[_Part] = msgspec.field(default_factory=list)


class _Candidate(msgspec.Struct, frozen=True, rename="camel"):
    content: _Content | None = None
    finish_reason: str | None = None


class _UsageMetadata(msgspec.Struct, frozen=True, rename="camel"):
    prompt_token_count: int | None = None
    cached_content_token_count: int | None = None
    candidates_token_count: int | None = None
    thoughts_token_count: int | None = None
    tool_use_prompt_token_count: int | None = None


class _PromptFeedback(msgspec.Struct, frozen=True, rename="camel"):
    block_reason: str | None = None


class _ApiError(msgspec.Struct, frozen=True):
    code: int = 0
    message: str = ""
    status: str = ""


class _Chunk(msgspec.Struct, frozen=True, rename="camel"):
    candidates: list[_Candidate] = msgspec.field(default_factory=list)
    usage_metadata: _UsageMetadata | None = None
    prompt_feedback: _PromptFeedback | None = None
    error: _ApiError | None = None


_chunk_decoder: Final = msgspec.json.Decoder(_Chunk)

_CONTENT_FILTER: Final = frozenset(
    {
        "SAFETY",
        "RECITATION",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
        "IMAGE_RECITATION",
    }
)
# Generation glitches that the same request may well not repeat.
_RETRYABLE_REASONS: Final = frozenset(
    {"MALFORMED_FUNCTION_CALL", "MALFORMED_RESPONSE", "TOO_MANY_TOOL_CALLS"}
)
MAX_STEP_CHARS: Final = 64 * 1024 * 1024
"""Characters accumulated per step before it fails with ``finish {error, limit_exceeded}``."""


class _Open:
    """The text or reasoning block that consecutive parts of one kind extend."""

    __slots__ = ("index", "kind", "parts")

    def __init__(self, index: int, kind: Literal["text", "reasoning"]) -> None:
        self.index = index
        self.kind: Literal["text", "reasoning"] = kind
        self.parts: list[str] = []


class GeminiNormaliser:
    """Gemini SSE events -> stream chunks (implements ``Normaliser``).

    One instance per step: ``feed`` every event, then ``close``. The step's ``usage`` and
    ``finish`` come from ``close`` once a ``finishReason`` was seen (or immediately on an error
    event); without one, ``close`` ends the step with ``finish {error}``. Example::

        n = GeminiNormaliser()
        chunks = [c for ev in events for c in n.feed(ev)] + n.close()
        # BlockStart(0, "text"), TextDelta(0, "The"), ..., Usage(...), Finish("stop")
    """

    def __init__(self) -> None:
        self._open: _Open | None = None
        self._next_index = 0
        self._tool_calls = 0
        self._signatures: list[dict[str, Any]] = []
        self._usage: _UsageMetadata | None = None
        self._reason: str | None = None
        self._chars = 0
        self._finished = False

    def feed(self, event: SseEvent) -> list[StreamChunk]:
        """The chunks this event completes (deltas, block ends)."""
        if self._finished:
            return []
        try:
            chunk = _chunk_decoder.decode(event.data)
        except msgspec.DecodeError as exc:
            return self._fail(StepError(f"undecodable Gemini event: {exc}", False, None))
        if chunk.error is not None:
            return self._fail(_api_error(chunk.error))
        self._usage = chunk.usage_metadata or self._usage
        if self._reason is not None:
            return []  # after finishReason only usage may still change
        return self._candidate(chunk)

    def close(self) -> list[StreamChunk]:
        """End of the body: ``usage`` (if any was sent) then ``finish``; ``finish {error}`` if
        no ``finishReason`` came."""
        if self._finished:
            return []
        if self._reason is None:
            message = "stream ended before the provider finished (no finishReason)"
            return self._fail(StepError(message, retryable=True, code="stream_truncated"))
        self._finished = True
        usage = [] if self._usage is None else [Usage(self._token_usage())]
        return [*usage, self._finish(self._reason)]

    def _candidate(self, chunk: _Chunk) -> list[StreamChunk]:
        if not chunk.candidates:
            feedback = chunk.prompt_feedback
            if feedback is not None and feedback.block_reason is not None:
                self._reason = feedback.block_reason  # the prompt itself was blocked
            return []
        candidate = chunk.candidates[0]
        out: list[StreamChunk] = []
        if candidate.content is not None:
            for part in candidate.content.parts:
                out += self._part(part)
        if candidate.finish_reason is not None:
            self._reason = candidate.finish_reason
            if candidate.finish_reason != "MAX_TOKENS":  # a cut block is left open
                out += self._end_open()
        if self._chars > MAX_STEP_CHARS:
            out += self._fail(StepError("step exceeds MAX_STEP_CHARS", False, "limit_exceeded"))
        return out

    def _part(self, part: _Part) -> list[StreamChunk]:
        if part.function_call is not None:
            ended = self._end_open()
            index = self._next_index
            self._sign(index, part.thought_signature)
            return ended + self._tool_call(index, part.function_call, part.thought_signature)
        if not part.text:  # empty (or non-text: inline data, code execution) parts
            self._sign(self._open.index if self._open else None, part.thought_signature)
            return []
        return self._text_part(part.text, "reasoning" if part.thought else "text", part)

    def _text_part(
        self, text: str, kind: Literal["text", "reasoning"], part: _Part
    ) -> list[StreamChunk]:
        block = self._open
        out: list[StreamChunk] = []
        if block is None or block.kind != kind:
            out = self._end_open()
            block = self._open = _Open(self._next_index, kind)
            self._next_index += 1
            out.append(BlockStart(block.index, kind))
        self._sign(block.index, part.thought_signature)
        block.parts.append(text)
        self._chars += len(text)
        if kind == "text":
            return [*out, TextDelta(block.index, text)]
        return [*out, ReasoningDelta(block.index, text)]

    def _end_open(self) -> list[StreamChunk]:
        block, self._open = self._open, None
        if block is None:
            return []
        text = "".join(block.parts)
        if block.kind == "text":
            return [BlockEnd(block.index, TextBlock(text))]
        return [BlockEnd(block.index, ReasoningBlock(text))]

    def _tool_call(
        self, index: int, call: _FunctionCall, signature: str | None
    ) -> list[StreamChunk]:
        self._next_index += 1
        self._tool_calls += 1
        # Gemini sends the whole args object at once; its JSON text is kept byte for byte.
        arguments = bytes(call.args).decode()
        self._chars += len(arguments)
        call_id = signed_call_id(call.id or f"call_{index}_{call.name}", signature)
        return [
            BlockStart(index, "tool-call"),
            ToolCallDelta(index, call_id, call.name, arguments),
            BlockEnd(index, ToolCallBlock(call_id, call.name, arguments)),
        ]

    def _sign(self, index: int | None, signature: str | None) -> None:
        if signature:
            self._signatures.append({"index": index, "signature": signature})

    def _finish(self, raw_reason: str) -> Finish:
        state = {"thought_signatures": self._signatures} if self._signatures else None
        if raw_reason == "STOP":
            return Finish("tool-calls" if self._tool_calls else "stop", replay_state=state)
        reason: FinishReason | None = None
        if raw_reason == "MAX_TOKENS":
            reason = "max-tokens"
        elif raw_reason in _CONTENT_FILTER:
            reason = "content-filter"
        if reason is not None:
            return Finish(reason, replay_state=state)
        # OTHER, LANGUAGE, UNEXPECTED_TOOL_CALL, MALFORMED_FUNCTION_CALL, unknown future values:
        # the answer is not a usable message, so the step fails, naming the reason.
        retryable = raw_reason in _RETRYABLE_REASONS
        error = StepError(f"Gemini finishReason {raw_reason}", retryable, raw_reason)
        return Finish("error", error=error, replay_state=state)

    def _fail(self, error: StepError) -> list[StreamChunk]:
        """End the step with ``finish {error}``, after the usage seen so far (if any)."""
        self._finished = True
        usage = [] if self._usage is None else [Usage(self._token_usage())]
        return [*usage, Finish("error", error=error)]

    def _token_usage(self) -> TokenUsage:
        meta = self._usage or _UsageMetadata()
        cached = meta.cached_content_token_count
        prompt = meta.prompt_token_count
        if prompt is not None:
            # promptTokenCount includes the cached part; tool-use prompts are counted apart.
            prompt = prompt - (cached or 0) + (meta.tool_use_prompt_token_count or 0)
        return TokenUsage(
            input_tokens=prompt,
            output_tokens=meta.candidates_token_count,
            cache_read_tokens=cached,
            reasoning_tokens=meta.thoughts_token_count,
        )


def _api_error(error: _ApiError) -> StepError:
    # UNAVAILABLE, INTERNAL, RESOURCE_EXHAUSTED (429), DEADLINE_EXCEEDED (504): retryable.
    retryable = is_retryable(status=error.code or None, code=error.status or None)
    code = error.status or (str(error.code) if error.code else None)
    return StepError(error.message or code or "Gemini error", retryable, code)
