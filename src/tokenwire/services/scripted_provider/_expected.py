"""The ground truth of a scripted step, read from the script (never from the emitted bytes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from tokenwire.schemas import (
    ContentBlock,
    FinishReason,
    Message,
    ReasoningBlock,
    RecordedError,
    TextBlock,
    TokenUsage,
    ToolCallBlock,
)
from tokenwire.services.scripted_provider._errors import NoScriptError
from tokenwire.services.scripted_provider._request import Dialect, decode_request
from tokenwire.services.scripted_provider._script import Script, build_script
from tokenwire.services.scripted_provider._settings import (
    ScriptedSettings,
    apply_overrides,
    header_options,
)

DROP_MESSAGE = "the scripted upstream closed the stream before it finished"


class FragmentCounts(msgspec.Struct, frozen=True):
    """Content fragments the stream carries, by kind: the hint for chunk counts.

    Each fragment is one delta on the wire (one ``TextDelta``, ``ReasoningDelta`` or
    ``ToolCallDelta`` after normalisation); structural events (role, block start/stop,
    tool-call headers, finish, usage) come on top.
    """

    reasoning: int = 0
    text: int = 0
    tool_arguments: int = 0

    @property
    def total(self) -> int:
        """All content fragments."""
        return self.reasoning + self.text + self.tool_arguments


class ExpectedStep(msgspec.Struct, frozen=True, kw_only=True):
    """What a correct pipeline records for one scripted step.

    ``text``, ``reasoning`` and the tool calls are what the provider sent, also for a failed
    step (what the caller saw before the failure). ``error`` is set exactly when the step
    fails; its ``kind`` and ``code`` are exact, its ``message`` is the provider's message when
    the provider sent one (``error``, ``http-*``) and a description otherwise (``drop``,
    ``truncate``). ``usage`` is ``None`` when the provider sends none (streams without
    ``stream_options.include_usage``, failed steps). ``stall_after`` is the number of fragments
    sent before a ``stall`` stops the stream.
    """

    scenario: str
    dialect: Dialect
    finish_reason: FinishReason
    text: str = ""
    reasoning: str = ""
    signature: str | None = None
    tool_calls: list[ToolCallBlock] = msgspec.field(default_factory=list)
    dropped_tool_calls: list[ToolCallBlock] = msgspec.field(default_factory=list)
    usage: TokenUsage | None = None
    error: RecordedError | None = None
    fragments: FragmentCounts = FragmentCounts()
    http_status: int = 200
    stall_after: int | None = None

    @property
    def failed(self) -> bool:
        """Whether the step produces a recorded error instead of a message."""
        return self.error is not None

    @property
    def message(self) -> Message | None:
        """The assembled message of a completed step; ``None`` for a failed one."""
        if self.failed:
            return None
        content: list[ContentBlock] = []
        if self.reasoning:
            content.append(ReasoningBlock(self.reasoning, signature=self.signature))
        if self.text:
            content.append(TextBlock(self.text))
        content += self.tool_calls
        return Message(
            content=content,
            finish_reason=self.finish_reason,
            usage=self.usage,
            dropped_tool_calls=self.dropped_tool_calls,
        )


def expected_outcome(
    scenario: str,
    request_json: bytes | str | Mapping[str, Any],
    settings: ScriptedSettings,
    *,
    headers: Mapping[str, str] | None = None,
    dialect: Dialect = "openai",
) -> ExpectedStep:
    """The ground truth of the step the scripted provider streams for this request.

    ``scenario`` wins over the request's model; options in the model name
    (``text?fragments=3``) and ``X-Scripted-*`` ``headers`` apply as the server applies them,
    and ``X-Tokenwire-Session`` seeds the content. Example::

        step = expected_outcome("tools", {"model": "scripted/tools", "messages": [...]}, settings)
        assert [c.name for c in step.tool_calls] == ["get_weather", "get_time"]

    Raises :class:`NoScriptError` for ``recording`` and :class:`UnknownScenarioError` for an
    unknown name.
    """
    if scenario == "recording":
        raise NoScriptError(scenario)
    request = decode_request(request_json, headers or {})
    options = {**request.options, **header_options(headers or {})}
    script = build_script(scenario, request, apply_overrides(settings, options), dialect)
    return outcome_of(script, stream=request.stream, include_usage=request.include_usage)


def outcome_of(script: Script, *, stream: bool, include_usage: bool) -> ExpectedStep:
    """The ground truth of one script, as streamed (or not) with or without a usage chunk."""
    calls = [ToolCallBlock(c.id, c.name, c.arguments) for c in script.tool_calls]
    cut = script.ending == "max-tokens"
    if cut and script.dialect == "anthropic" and not stream:
        calls = []  # a non-streaming Anthropic message cannot carry a cut tool input
    error = _error(script)
    return ExpectedStep(
        scenario=script.scenario,
        dialect=script.dialect,
        finish_reason="error" if error else _FINISH[script.ending],
        text="".join(script.text),
        reasoning="".join(script.reasoning),
        signature=script.signature if script.dialect == "anthropic" else None,
        tool_calls=[] if cut else calls,
        dropped_tool_calls=calls if cut else [],
        usage=None if error else _usage(script, stream=stream, include_usage=include_usage),
        error=error,
        fragments=FragmentCounts(
            len(script.reasoning),
            len(script.text),
            sum(len(c.fragments) for c in script.tool_calls),
        ),
        http_status=script.http_status or 200,
        stall_after=script.stall_after,
    )


_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "tool-calls": "tool-calls",
    "max-tokens": "max-tokens",
}


def _error(script: Script) -> RecordedError | None:
    failure = script.failure
    if failure is not None:
        code = failure.openai_code if script.dialect == "openai" else failure.anthropic_type
        return RecordedError("provider", failure.message, retryable=failure.retryable, code=code)
    if script.ending in ("drop", "truncate"):
        return RecordedError("provider", DROP_MESSAGE, retryable=True)
    return None


def _usage(script: Script, *, stream: bool, include_usage: bool) -> TokenUsage | None:
    if script.dialect == "openai" and stream and not include_usage:
        return None
    total = script.fragment_count
    reasoning = len(script.reasoning)
    if script.dialect == "openai" and reasoning:  # reported apart: output excludes it
        return TokenUsage(script.input_tokens, total - reasoning, reasoning_tokens=reasoning)
    return TokenUsage(input_tokens=script.input_tokens, output_tokens=total)
