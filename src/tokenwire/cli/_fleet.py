"""The demo fleet: concurrent agent sessions driving the gateway with the official openai SDK.

Each session runs ``turns`` turns of ``steps`` steps: step 0 of a turn asks for tools
(``scripted/tools``: two parallel tool calls), middle steps reason, the last answers in text,
and the agent feeds tool results back as a real agent loop would. Two steps are made to fail
so that the demo shows both failure paths: session 0 ends turn 0 with a max-tokens cut inside
a tool call, and session 1 meets a provider error mid-stream at turn 0, step 0.
:func:`expected_totals` computes what the store must hold from the plan alone; the demo
compares the two. Which failures are the plan's: :func:`classify`; which are sent again:
:class:`RetryPolicy`.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import assert_never, cast

import openai
from openai.types.chat import (
    ChatCompletionChunk,
    ChatCompletionMessageParam,
    ChatCompletionToolParam,
)

# What the agents offer the model (a real provider decides whether to call them).
TOOLS: list[ChatCompletionToolParam] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"Look up the {what} for a place.",
            "parameters": {
                "type": "object",
                "properties": {"location": {"type": "string"}},
                "required": ["location"],
            },
        },
    }
    for name, what in (("get_weather", "weather"), ("get_time", "local time"))
]

MAX_TOKENS_AT = (0, 0)  # (session, turn): its last step is cut by max-tokens
ERROR_AT = (1, 0, 0)  # (session, turn, step): the provider fails mid-stream

KEPT_FAILURES = 100
"""Unexpected failures kept with their details (the count is always exact)."""
MESSAGE_CHARS = 300
"""The longest error message kept of one failure."""
IN_STREAM = "in-stream"
"""A failure's ``error`` when it was an error event after the stream began (no HTTP status)."""
STEP_ECHO = "x-tokenwire-step"
"""The response header the gateway echoes once the request's step is claimed."""


@dataclass(frozen=True, kw_only=True)
class FleetPlan:
    """How many sessions, turns and steps, and the id prefix of the sessions."""

    sessions: int
    turns: int
    steps: int
    run_id: str
    provider: str = "scripted"
    model: str | None = None

    @property
    def scripted(self) -> bool:
        """Offline: scenarios chosen per step, outcomes known in advance."""
        return self.provider == "scripted"

    def session_id(self, k: int) -> str:
        return f"demo-{self.run_id}-{k:03d}"

    def model_for(self, k: int, turn: int, step: int) -> str:
        """The ``provider/model`` a step asks the gateway for."""
        if self.scripted:
            return f"scripted/{self.scenario(k, turn, step)}"
        return f"{self.provider}/{self.model}"

    def scenario(self, k: int, turn: int, step: int) -> str:
        """The scripted scenario of one step (see the module docstring)."""
        if (k, turn, step) == ERROR_AT:
            return "error"
        if (k, turn) == MAX_TOKENS_AT and step == self.steps - 1:
            return "max-tokens"
        if step == self.steps - 1:
            return "text"
        return "tools" if step == 0 else "reasoning"

    def provider_error_planned(self, k: int, turn: int, step: int) -> bool:
        """Whether an in-stream provider error is a planned outcome of this step: the scripted
        ``error`` step; against a real provider any step (its failures are not known in
        advance, and the gateway records each as the step's outcome)."""
        return not self.scripted or self.scenario(k, turn, step) == "error"


@dataclass(frozen=True)
class ExpectedTotals:
    """What a correct pipeline persists for a plan."""

    steps: int
    messages: int
    errors: int
    max_tokens_messages: int


def expected_totals(plan: FleetPlan) -> ExpectedTotals:
    """Count the plan's steps by outcome, from the plan alone.

    Against a real provider only the number of steps is known in advance (every step ends as
    a message or a recorded error); the other counts are -1 (unknown).
    """
    if not plan.scripted:
        steps = plan.sessions * plan.turns * plan.steps
        return ExpectedTotals(steps=steps, messages=-1, errors=-1, max_tokens_messages=-1)
    scenarios = [
        plan.scenario(k, t, s)
        for k in range(plan.sessions)
        for t in range(plan.turns)
        for s in range(plan.steps)
    ]
    errors = scenarios.count("error")
    return ExpectedTotals(
        steps=len(scenarios),
        messages=len(scenarios) - errors,
        errors=errors,
        max_tokens_messages=scenarios.count("max-tokens"),
    )


@dataclass(frozen=True)
class StepAt:
    """One step of the fleet: the explicit (session, turn, step) its request names."""

    session: str
    turn: int
    step: int

    def headers(self) -> dict[str, str]:
        """The tokenwire headers naming the step."""
        return {
            "X-Tokenwire-Session": self.session,
            "X-Tokenwire-Turn": str(self.turn),
            "X-Tokenwire-Step": str(self.step),
        }


@dataclass(frozen=True)
class RequestFailure:
    """A step's request that failed where the plan expected no failure.

    ``status`` is the HTTP status the gateway answered, ``None`` when there was none (a
    connection error or a timeout, or an error event after the stream began); ``error`` is the
    SDK's exception class (``InternalServerError``, ``APIConnectionError``, ...) or
    ``"in-stream"``; ``message`` is the gateway's error message (at most
    :data:`MESSAGE_CHARS`).
    """

    session: str
    turn: int
    step: int
    status: int | None
    error: str
    message: str

    def line(self) -> str:
        """One line: session, turn, step, status (or error), message."""
        status = self.error if self.status is None else str(self.status)
        return f"{self.session} turn {self.turn} step {self.step} {status}: {self.message}"


@dataclass(frozen=True)
class PlannedError:
    """A provider error where the plan allows one, recorded by the gateway as the step's
    outcome (the scripted ``error`` step's in-stream error; any of a real provider's)."""

    message: str


StepFailure = PlannedError | RequestFailure


def classify(exc: openai.APIError, at: StepAt, planned: bool) -> StepFailure:
    """Whether ``exc``, raised by the SDK for the step ``at``, is the plan's provider error
    (``planned``: :meth:`FleetPlan.provider_error_planned`) or an unexpected failure.

    The scripted ``error`` scenario streams text first, so the gateway has answered 200 and
    begun the stream when the provider's in-band error arrives, and ends it with the dialect's
    in-stream error event, which the SDK raises as a plain ``openai.APIError``. An HTTP status
    (the gateway refused the request), a connection error or timeout, or an in-stream error at
    a step the plan did not make fail, is a :class:`RequestFailure`, kept for the summary.

    A planned error is an in-stream error or, where the plan allows
    one, an error status the gateway answered after claiming the step and recorded as the
    step's outcome (:func:`_recorded_as_outcome`: a real provider's 429, say). Any other
    status, a connection error or a timeout is unexpected whatever the plan says.
    """
    if planned and isinstance(exc, openai.APIStatusError) and _recorded_as_outcome(exc):
        return PlannedError(_gateway_message(exc))
    if isinstance(exc, openai.APIStatusError | openai.APIResponseValidationError):
        return _failure(at, exc.status_code, type(exc).__name__, _gateway_message(exc))
    if isinstance(exc, openai.APIConnectionError):  # APITimeoutError too
        return _failure(at, None, type(exc).__name__, _connection_message(exc))
    if planned:
        return PlannedError(_gateway_message(exc))
    return _failure(at, None, IN_STREAM, _gateway_message(exc))


def _recorded_as_outcome(exc: openai.APIStatusError) -> bool:
    """Whether the gateway recorded this failure as the step's outcome: it answered after the
    claim (the step is echoed) with a step failure other than the broker's own
    (``overloaded_error``: nothing was captured). ADR 0006: such a step is one error chunk."""
    return STEP_ECHO in exc.response.headers and exc.code != "overloaded_error"


def _failure(at: StepAt, status: int | None, error: str, message: str) -> RequestFailure:
    return RequestFailure(at.session, at.turn, at.step, status, error, message)


def _gateway_message(exc: openai.APIError) -> str:
    """The message of the gateway's error object (the SDK keeps the object as ``body``), else
    the body's text, else the SDK's message; on one line, bounded."""
    body = exc.body
    message = body.get("message") if isinstance(body, dict) else body
    return _bounded(message if isinstance(message, str) and message else exc.message)


def _connection_message(exc: openai.APIConnectionError) -> str:
    cause = exc.__cause__
    detail = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
    return _bounded(exc.message + detail)


def _bounded(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= MESSAGE_CHARS else line[: MESSAGE_CHARS - 3] + "..."


@dataclass(frozen=True)
class RetryPolicy:
    """When a refused request is sent again: at most ``tries`` requests per step, each wait the
    ``retry-after`` the gateway asked for, capped at ``max_wait_s``.

    The SDK's own retries are off (``max_retries=0``) because every step is an explicit
    (session, turn, step): the gateway claims the triple in the step registry before it calls
    the provider and never releases it, also when the request then fails (a provider error is
    recorded as the step's outcome; a broker that does not acknowledge leaves the claim with
    nothing published). Sent again, such a request is refused with 409, and the SDK's retry
    would hide the first failure behind a ``ConflictError``. The one refusal worth another try
    is the one before the claim: the gateway's edge at its concurrency limit answers 503 with
    ``retry-after`` and without the ``X-Tokenwire-*`` echo of a claimed step. A 503 or 429
    that echoes the step came after the claim; a 503 without ``retry-after`` is the step
    registry not answering (after its own retries), whose claim may have landed
    unacknowledged; a connection error or a timeout may have reached the claim too. None of
    those is sent again.
    """

    tries: int = 3
    max_wait_s: float = 5.0

    def wait_s(self, exc: openai.APIStatusError, tries: int) -> float | None:
        """How long to wait before another try, after ``tries`` tries; ``None``: no more."""
        if tries >= self.tries or exc.status_code not in (429, 503):
            return None
        if STEP_ECHO in exc.response.headers:
            return None  # claimed: sent again, the step would be refused with 409
        asked = _seconds(exc.response.headers.get("retry-after"))
        return None if asked is None else min(asked, self.max_wait_s)


DEFAULT_RETRY = RetryPolicy()


def _seconds(value: str | None) -> float | None:
    """A ``retry-after`` in seconds (its HTTP-date form is not honoured: ``None``)."""
    try:
        seconds = float(value) if value is not None else math.nan
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


@dataclass
class FleetResult:
    """What the agents saw: per step outcome and client-side time to first chunk.

    ``failures`` holds the first :data:`KEPT_FAILURES` unexpected failures, in the order they
    happened; ``unexpected_failures`` counts them all.
    """

    completed_steps: int = 0
    provider_errors: int = 0
    unexpected_failures: int = 0
    retried_requests: int = 0
    tool_calls: int = 0
    client_ttfc_s: list[float] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)
    failures: list[RequestFailure] = field(default_factory=list)
    wall_s: float = 0.0

    def record(self, failure: StepFailure) -> None:
        """Count a failed step: the plan's provider error, or an unexpected failure."""
        match failure:
            case PlannedError():
                self.provider_errors += 1
            case RequestFailure():
                self.unexpected_failures += 1
                if len(self.failures) < KEPT_FAILURES:
                    self.failures.append(failure)
            case _:
                assert_never(failure)


async def run_fleet(
    plan: FleetPlan,
    gateway_url: str,
    on_step: Callable[[], None] = lambda: None,
    retry: RetryPolicy = DEFAULT_RETRY,
) -> FleetResult:
    """Run every session of ``plan`` concurrently against the gateway."""
    result = FleetResult(sessions=[plan.session_id(k) for k in range(plan.sessions)])
    client = openai.AsyncOpenAI(base_url=f"{gateway_url}/v1", api_key="demo", max_retries=0)
    started = time.perf_counter()
    try:
        await asyncio.gather(
            *(_session(client, plan, k, result, on_step, retry) for k in range(plan.sessions))
        )
    finally:
        await client.close()
    result.wall_s = time.perf_counter() - started
    return result


async def _session(
    client: openai.AsyncOpenAI,
    plan: FleetPlan,
    k: int,
    result: FleetResult,
    on_step: Callable[[], None],
    retry: RetryPolicy,
) -> None:
    for turn in range(plan.turns):
        messages: list[dict[str, object]] = [
            {
                "role": "user",
                "content": f"Session {k}, turn {turn}: plan the trip and check the weather.",
            }
        ]
        for step in range(plan.steps):
            at = StepAt(plan.session_id(k), turn, step)
            try:
                await _step(client, plan.model_for(k, turn, step), messages, at, result, retry)
            except openai.APIError as exc:
                result.record(classify(exc, at, plan.provider_error_planned(k, turn, step)))
            on_step()


@dataclass
class _Reply:
    """What the agent took from one streamed answer."""

    first: float | None = None  # when the first chunk arrived
    text: list[str] = field(default_factory=list)
    calls: dict[int, dict[str, str]] = field(default_factory=dict)
    finish: str | None = None


async def _step(
    client: openai.AsyncOpenAI,
    model: str,
    messages: list[dict[str, object]],
    at: StepAt,
    result: FleetResult,
    retry: RetryPolicy,
) -> None:
    """One model call and the agent's turn after it; a failure raises ``openai.APIError``."""
    sent = time.perf_counter()
    stream = await _open(client, model, messages, at, result, retry)
    reply = await _read(stream)
    if reply.first is not None:
        result.client_ttfc_s.append(reply.first - sent)
    result.completed_steps += 1
    calls = {} if reply.finish == "length" else reply.calls  # a call cut by max-tokens: dropped
    _continue_conversation(messages, "".join(reply.text), calls, result)


async def _open(
    client: openai.AsyncOpenAI,
    model: str,
    messages: list[dict[str, object]],
    at: StepAt,
    result: FleetResult,
    retry: RetryPolicy,
) -> openai.AsyncStream[ChatCompletionChunk]:
    """The step's stream, once the gateway accepted the request (``retry`` says when a
    refusal is tried again)."""
    tries = 1
    while True:
        try:
            return await client.chat.completions.create(
                model=model,
                messages=cast("list[ChatCompletionMessageParam]", messages),
                stream=True,
                extra_headers=at.headers(),
                stream_options={"include_usage": True},
                tools=TOOLS,
                max_tokens=512,
            )
        except openai.APIStatusError as exc:
            wait_s = retry.wait_s(exc, tries)
            if wait_s is None:
                raise
        result.retried_requests += 1
        tries += 1
        await asyncio.sleep(wait_s)


async def _read(stream: openai.AsyncStream[ChatCompletionChunk]) -> _Reply:
    """Accumulate the streamed text, tool calls and finish reason."""
    reply = _Reply()
    async for chunk in stream:
        reply.first = reply.first or time.perf_counter()
        for choice in chunk.choices:
            reply.finish = choice.finish_reason or reply.finish
            reply.text.append(choice.delta.content or "")
            for call in choice.delta.tool_calls or []:
                slot = reply.calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] = call.id or slot["id"]
                if call.function is not None:
                    slot["name"] = call.function.name or slot["name"]
                    slot["arguments"] += call.function.arguments or ""
    return reply


def _continue_conversation(
    messages: list[dict[str, object]],
    text: str,
    calls: dict[int, dict[str, str]],
    result: FleetResult,
) -> None:
    """Append the assistant's turn and, for each tool call, the tool's result."""
    tool_calls = [
        {
            "id": c["id"],
            "type": "function",
            "function": {"name": c["name"], "arguments": c["arguments"]},
        }
        for _, c in sorted(calls.items())
    ]
    messages.append(
        {
            "role": "assistant",
            "content": text or None,
            **({"tool_calls": tool_calls} if tool_calls else {}),
        }
    )
    for call in tool_calls:
        result.tool_calls += 1
        arguments = call["function"]["arguments"]  # type: ignore[index]  # a tool call's JSON, read by key
        try:
            parsed = json.loads(arguments)  # parsed once, at dispatch, as the contract says
        except ValueError:
            parsed = None
        messages.append(
            {
                "role": "tool",
                "tool_call_id": call["id"],
                "content": json.dumps({"ok": True, "echo": parsed}),
            }
        )
