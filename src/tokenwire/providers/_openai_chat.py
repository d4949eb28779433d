"""OpenAI Chat Completions (and compatible servers) SSE events -> stream chunks.

Covers api.openai.com, Azure OpenAI, DeepSeek, OpenRouter, Groq, vLLM and the legacy
Completions stream (``choices[].text``). Only choice ``index`` 0 is normalised (``n > 1`` is
not a tokenwire use case); other choices are ignored.

Mapping (see docs/providers.md): ``delta.content`` / ``choices[].text`` -> text;
``delta.reasoning_content`` (DeepSeek) / ``delta.reasoning`` (OpenRouter, Groq) -> reasoning;
``delta.refusal`` -> text, and the step finishes ``refusal``; ``delta.tool_calls[i]`` -> one
tool-call block per ``i``. The step ends at ``[DONE]`` (or at the end of the body after a
``finish_reason``), at an ``event: error`` or at a chunk with an ``error`` object.
"""

from __future__ import annotations

from typing import Final

import msgspec

from tokenwire.providers._builder import BlockBuilder, OpenKind, step_error
from tokenwire.providers._errors import is_retryable
from tokenwire.schemas import Finish, FinishReason, StepError, StreamChunk, TokenUsage, Usage
from tokenwire.sse import SseEvent

__all__ = ["OpenAIChatNormaliser", "chat_usage"]

_FINISH_REASONS: Final[dict[str, FinishReason]] = {
    "stop": "stop",
    "length": "max-tokens",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "content_filter": "content-filter",
    "refusal": "refusal",
}
ENDED_EARLY: Final = "stream ended before the provider finished"


class _Function(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class _ToolCall(msgspec.Struct):
    index: int = 0
    id: str | None = None
    function: _Function | None = None


class _Delta(msgspec.Struct):
    content: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    refusal: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(msgspec.Struct):
    index: int = 0
    delta: _Delta | None = None
    text: str | None = None  # the legacy Completions stream
    finish_reason: str | None = None


class _PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None


class _CompletionDetails(msgspec.Struct):
    reasoning_tokens: int | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: _PromptDetails | None = None
    completion_tokens_details: _CompletionDetails | None = None
    prompt_cache_hit_tokens: int | None = None  # DeepSeek


class _Error(msgspec.Struct):
    message: str = ""
    code: int | str | None = None
    type: str | None = None
    status_code: int | None = None


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = msgspec.field(default_factory=list)
    usage: _Usage | None = None
    error: _Error | None = None  # OpenRouter puts a mid-stream error inside a chunk


class _ErrorEvent(msgspec.Struct):
    error: _Error | None = None


_chunk_decoder: Final = msgspec.json.Decoder(_Chunk)
_error_decoder: Final = msgspec.json.Decoder(_ErrorEvent)
_bare_error_decoder: Final = msgspec.json.Decoder(_Error)


def chat_usage(
    prompt: int | None, completion: int | None, cached: int | None, reasoning: int | None
) -> TokenUsage:
    """Disjoint usage from OpenAI-style totals: cached and reasoning counts taken back out.

    A part is subtracted only when it fits inside its total: a provider reporting more
    reasoning tokens than completion tokens (seen from OpenRouter) evidently did not fold them
    in, so the total is kept as it is rather than turned negative.
    """
    return TokenUsage(
        input_tokens=_minus(prompt, cached),
        output_tokens=_minus(completion, reasoning),
        cache_read_tokens=cached,
        reasoning_tokens=reasoning,
    )


def _minus(total: int | None, part: int | None) -> int | None:
    if total is None or part is None or part > total:
        return total
    return total - part


def _usage(raw: _Usage) -> TokenUsage:
    cached = raw.prompt_cache_hit_tokens
    if cached is None and raw.prompt_tokens_details is not None:
        cached = raw.prompt_tokens_details.cached_tokens
    details = raw.completion_tokens_details
    reasoning = details.reasoning_tokens if details is not None else None
    return chat_usage(raw.prompt_tokens, raw.completion_tokens, cached, reasoning)


def _error(raw: _Error) -> StepError:
    numeric = raw.code if isinstance(raw.code, int) else None
    status = raw.status_code if raw.status_code is not None else numeric
    code = raw.code if isinstance(raw.code, str) else raw.type
    if code is None and numeric is not None:
        code = str(numeric)
    return step_error(raw.message, is_retryable(status, code), code)


class OpenAIChatNormaliser:
    """Chat Completions SSE events -> :data:`StreamChunk` (implements ``Normaliser``).

    Example::

        norm = OpenAIChatNormaliser()
        chunks = [c for e in SseParser().feed(body) for c in norm.feed(e)] + norm.close()
    """

    __slots__ = ("_blocks", "_current", "_done", "_finish_reason", "_refused", "_tools", "_usage")

    def __init__(self) -> None:
        self._blocks = BlockBuilder()
        self._current: tuple[OpenKind, int] | None = None  # the open text/reasoning block
        self._tools: dict[int, int] = {}  # provider tool_calls index -> block index
        self._finish_reason: str | None = None
        self._usage: TokenUsage | None = None
        self._refused = False
        self._done = False

    def feed(self, event: SseEvent) -> list[StreamChunk]:
        """Normalise one SSE event; nothing once the step has finished."""
        if self._done:
            return []
        if event.event == "error":
            return self._fail(self._event_error(event.data))
        if event.data == "[DONE]":
            return self._end_of_stream(done=True)
        try:
            chunk = _chunk_decoder.decode(event.data)
        except msgspec.DecodeError as exc:
            return self._fail(step_error(f"undecodable chunk from provider: {exc}", False, None))
        return self._chunk(chunk)

    def close(self) -> list[StreamChunk]:
        """End of the body: finish normally after a ``finish_reason``, else ``finish {error}``."""
        if self._done:
            return []
        return self._end_of_stream(done=False)

    def _chunk(self, chunk: _Chunk) -> list[StreamChunk]:
        out: list[StreamChunk] = []
        if chunk.usage is not None:
            self._usage = _usage(chunk.usage)
        for choice in chunk.choices:
            if choice.index == 0:
                self._choice(choice, out)
        if chunk.error is not None:
            out += self._fail(_error(chunk.error))
        return out

    def _choice(self, choice: _Choice, out: list[StreamChunk]) -> None:
        delta = choice.delta
        if delta is not None:
            self._text("reasoning", delta.reasoning_content or delta.reasoning, out)
            self._text("text", delta.content, out)
            if delta.refusal:
                self._refused = True
                self._text("text", delta.refusal, out)
            for call in delta.tool_calls or ():
                self._tool_call(call, out)
        self._text("text", choice.text, out)
        if choice.finish_reason is not None:
            self._finish_reason = choice.finish_reason

    def _text(self, kind: OpenKind, fragment: str | None, out: list[StreamChunk]) -> None:
        if not fragment:
            return
        if self._current is None or self._current[0] != kind:
            self._close_current(out)
            self._current = (kind, self._blocks.open(kind, out))
        out.append(self._blocks.text(self._current[1], fragment))

    def _close_current(self, out: list[StreamChunk]) -> None:
        if self._current is not None:
            self._blocks.close(self._current[1], out)
            self._current = None

    def _tool_call(self, call: _ToolCall, out: list[StreamChunk]) -> None:
        fn = call.function or _Function()
        index = self._tools.get(call.index)
        first = index is None
        if index is None:
            self._close_current(out)
            call_id = call.id or f"call_{call.index}"  # a compatible server that sent no id
            index = self._blocks.open("tool-call", out, call_id, fn.name or "")
            self._tools[call.index] = index
        if first or fn.arguments:
            out.append(self._blocks.arguments(index, fn.arguments or "", with_name=first))

    def _end_of_stream(self, done: bool) -> list[StreamChunk]:
        if self._finish_reason is None:
            message = "provider sent [DONE] without a finish_reason" if done else ENDED_EARLY
            return self._fail(step_error(message, True, None))
        out: list[StreamChunk] = []
        reason = self._reason(self._finish_reason)
        if reason != "max-tokens":  # a truncated answer's open blocks were cut: left open
            self._close_current(out)
            self._blocks.close_all(out)
        return out + self._terminal(Finish(reason=reason))

    def _reason(self, raw: str) -> FinishReason:
        reason = _FINISH_REASONS.get(raw, "stop")
        if self._refused and reason == "stop":
            return "refusal"
        if self._blocks.has_tool_calls and reason == "stop":
            return "tool-calls"  # compatible servers that say "stop" after tool calls
        return reason

    def _event_error(self, data: str) -> StepError:
        try:
            raw = _error_decoder.decode(data).error or _bare_error_decoder.decode(data)
        except msgspec.DecodeError:
            return step_error(data.strip(), False, None)
        return _error(raw)

    def _fail(self, error: StepError) -> list[StreamChunk]:
        return self._terminal(Finish(reason="error", error=error))

    def _terminal(self, finish: Finish) -> list[StreamChunk]:
        self._done = True
        if self._usage is None:
            return [finish]
        return [Usage(usage=self._usage), finish]
