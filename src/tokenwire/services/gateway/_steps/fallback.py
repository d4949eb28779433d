"""A routed step's attempts: the provider calls it makes before its first byte, one step and
one step identity whatever their number (docs/gateway.md, "Routes"; ADR 0040).

The app sends the first call (:class:`Attempt`) and hands the step a :class:`RoutedStep`. When
that call fails before anything reached the caller in a way another deployment may not
(:mod:`~._routing.attempts`), the step asks :meth:`RoutedStep.fallback` for the next one: the
failure is recorded (on the step's first chunk, ``routed.attempts``), told to the health book
(it may cool the deployment down for every gateway), and the plan's next deployment is called:
the group's others, then the declared fallbacks, translated for their dialect with the same
table and the same never-drop-silently rule as any request (a fallback the request cannot be
translated for is recorded as ``untranslatable`` and skipped: nothing is dropped to reach it).
Once a chunk went to the caller nothing is retried: a failure after it ends the step as today.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field

from tokenwire.providers import ProviderHTTPError
from tokenwire.schemas import FailedAttempt, Finish, Routed, StepError, StreamChunk
from tokenwire.services.gateway._errors import RequestError
from tokenwire.services.gateway._observe.metrics import GatewayMetrics
from tokenwire.services.gateway._output.caller import CallerOutput
from tokenwire.services.gateway._routing.attempts import (
    FIRST_BYTE_TIMEOUT,
    empty_failure,
    finish_failure,
    http_failure,
    untranslatable,
)
from tokenwire.services.gateway._routing.health import HealthBook
from tokenwire.services.gateway._routing.plan import Candidate, RoutePlan
from tokenwire.services.gateway._routing.routing import Route
from tokenwire.services.gateway._routing.upstream import UpstreamCall
from tokenwire.services.gateway._steps.watchdog import Watchdog


@dataclass
class Attempt:
    """One call of a routed step: the deployment, the Route as sent (the caller's forwarded
    headers and, for the scripted provider, the step's identity), the call on its way, the
    caller's output for its dialect (forwarded or encoded) and the answer's extra headers (the
    fields dropped with the opt-in)."""

    candidate: Candidate
    route: Route
    call: UpstreamCall
    output: CallerOutput
    forwarded: bool
    response_headers: dict[str, str] = field(default_factory=dict)


MakeAttempt = Callable[[Candidate], Attempt]
"""Translates the request for a candidate and sends it (a :class:`RequestError` when the
request cannot be translated for its dialect)."""


class RoutedStep:
    """The attempts of one routed step (see the module)."""

    def __init__(
        self,
        plan: RoutePlan,
        health: HealthBook,
        first: Attempt,
        make: MakeAttempt,
        metrics: GatewayMetrics,
        *,
        skipped: list[FailedAttempt] | None = None,
    ) -> None:
        self.plan = plan
        self.current = first
        self.failed: list[FailedAttempt] = list(skipped or ())  # first picks not carried
        self._health = health
        self._make = make
        self._metrics = metrics
        self._open = True  # the current call counts as in flight

    def first_byte_timeout_s(self) -> float | None:
        """How long the current call may take to its first token (None: as long as the
        step's own bounds let it, since nothing would follow it)."""
        return self.plan.first_byte_timeout_s(self.current.candidate)

    async def fallback(self, failure: FailedAttempt) -> Attempt | None:
        """The current call failed before the first byte with ``failure``: the next call, sent,
        or None when no deployment is left within the bounds (the failure is the answer)."""
        spec = self.current.candidate.spec
        self._count(spec.name, failure.failure)
        self._health.failed(spec, self.current.candidate.policy, failure)
        mine = len(self.failed)
        self.failed.append(failure)
        while (candidate := await self.plan.next()) is not None:
            try:
                attempt = self._make(candidate)
            except RequestError as exc:
                skipped = untranslatable(candidate.spec, exc.message)
                self._count(candidate.spec.name, skipped.failure)
                self._health.done(candidate.spec)
                self.failed.append(skipped)
                continue
            self._close()
            self.current, self._open = attempt, True
            return attempt
        del self.failed[mine]  # the last call's failure is the step's own answer
        return None

    async def after_http_error(self, exc: ProviderHTTPError) -> Attempt | None:
        """The current call answered an HTTP error before any chunk: the next call, when the
        error is one to fall back on and a deployment is left."""
        failure = http_failure(self.current.candidate.spec, exc)
        return None if failure is None else await self.fallback(failure)

    async def after_first_read(self, batch: list[StreamChunk]) -> Attempt | None:
        """The current call's first read that brought chunks (empty: none came): the next
        call, when it is a failure to fall back on (``finish {error}`` at once, or nothing)."""
        spec = self.current.candidate.spec
        failure: FailedAttempt | None = None
        if not batch:
            failure = empty_failure(spec)
        elif isinstance(batch[0], Finish) and batch[0].error is not None:
            failure = finish_failure(spec, batch[0].error)
        return None if failure is None else await self.fallback(failure)

    def answered(self) -> None:
        """The current call's first chunk is published: it is the one that served the step."""
        spec = self.current.candidate.spec
        self._count(spec.name, "ok")
        self._health.answered(spec)
        if self.failed:
            self._metrics.fallbacks.labels(self.plan.name).inc()

    def ended(self, tokens: int) -> None:
        """The step ended (``tokens``: what its usage reported)."""
        if self._open:
            self._open = False
            self._health.done(self.current.candidate.spec, tokens)

    def routed(self) -> Routed:
        """What the step's first chunk says of its route: the deployment of the current call
        and the attempts that failed before it."""
        return self.plan.routed(self.current.candidate, self.failed)

    def not_tried(self) -> str:
        """``; fallback X not tried: why`` for each fallback skipped as untranslatable."""
        return "".join(
            f"; fallback {a.deployment} not tried: {a.message}"
            for a in self.failed
            if a.failure == "untranslatable"
        )

    def _close(self) -> None:
        if self._open:
            self._open = False
            self._health.done(self.current.candidate.spec)

    def _count(self, deployment: str, outcome: str) -> None:
        self._metrics.deployment_call(self.plan.name, deployment, outcome)


async def first_chunks(
    batches: AsyncGenerator[list[StreamChunk], None],
    watchdog: Watchdog | None,
    first_byte_s: float | None,
) -> list[StreamChunk]:
    """The first read that brought chunks (empty: the stream ended without one); a routed call
    that may be followed by another has its group's first-byte bound on the step's
    ``watchdog``, past which it reads as ``finish {error: first_byte_timeout}``."""
    try:
        async for batch in batches:
            if batch:
                return batch
        return []
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if watchdog is None or not watchdog.first_byte_overdue or task is None:
            raise
        watchdog.first_byte_overdue = False
        task.uncancel()
        message = f"no first token within {first_byte_s:g} s"
        error = StepError(message=message, retryable=True, code=FIRST_BYTE_TIMEOUT)
        return [Finish(reason="error", error=error)]
