"""One step through the gateway: read the provider to the end, publish every chunk, feed the
caller.

Semantics (docs/gateway.md, "Publishing"):

- every chunk is published in order as a :class:`ChunkEnvelope` (ordinal from 0, ``first`` on
  ordinal 0, ``request_time_ns`` on ordinal 0, the step's trace headers on every message);
  publishing waits only when the publisher's bounded window is full;
- a provider failure before any chunk (HTTP error, transport failure, an immediate error
  event) is still published as a one-chunk step ``finish {error}``, so the assembler records
  the error; the caller then gets the error status in its dialect;
- the caller's stream is completed (terminator) only after the broker acknowledged every
  chunk of the step; a broker failure ends the step at once with a 503 (before the stream
  began) or the dialect's in-stream error (after);
- when the caller leaves, the step keeps reading the provider to the end (default) or, with
  ``continue_on_disconnect=False``, publishes ``finish {aborted}`` and stops.

Two halves, so that nothing between the request and its first chunk waits for another task
(each task switch waits behind every other ready callback of a busy gateway):
:meth:`StepRun.begin` runs in the caller's request task, calls the provider, takes the chunks
of its first read, and raises the :class:`GatewayError` that prevented the start (after
recording it); :meth:`StepRun.finish_rest` runs as a task of its own, never raises (except
cancellation) and leaves a failure after the start in ``error``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import msgspec

from tokenwire.broker import BrokerError
from tokenwire.providers import ProviderHTTPError
from tokenwire.schemas import ChunkEnvelope, Finish, StepError, StreamChunk, json_encoder
from tokenwire.scrub import scrub as scrub_text
from tokenwire.services.gateway._errors import (
    BrokerUnavailableError,
    GatewayError,
    UpstreamError,
)
from tokenwire.services.gateway._identity import StepClaim, StepIdentity
from tokenwire.services.gateway._metrics import GatewayMetrics
from tokenwire.services.gateway._outbox import Outbox
from tokenwire.services.gateway._output import CallerOutput
from tokenwire.services.gateway._routing import Route
from tokenwire.services.gateway._seams import GatewayDeps

_COUNT_EVERY = 64
"""Published chunks are added to the Prometheus counter in groups of this many (and the rest
when the step ends): taking the counter's lock per chunk cost ~1% of the gateway's CPU."""


@dataclass(frozen=True)
class StepPlan:
    """Everything a step needs, decided before the provider is called.

    ``claim`` gives the step's identity: known for an explicit triple, sent to the registry
    beside the provider call for an assigned one (the step waits for it before it publishes).
    """

    session: str
    claim: StepClaim
    route: Route
    body: bytes
    request_time_ns: int
    trace_headers: dict[str, str]
    secrets: tuple[str, ...] = ()


def scrub(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every credential value replaced (providers may echo a key back)."""
    return scrub_text(text, secrets)


class StepRun:
    """Runs one planned step; see the module docstring for its semantics."""

    def __init__(
        self,
        plan: StepPlan,
        output: CallerOutput,
        outbox: Outbox,
        deps: GatewayDeps,
        metrics: GatewayMetrics,
        ack_timeout_s: float,
    ) -> None:
        self.plan = plan
        self.output = output
        self.outbox = outbox
        self.error: GatewayError | None = None
        self.finish: Finish | None = None
        self.task: asyncio.Task[None] | None = None
        self._deps = deps
        self._metrics = metrics
        self._ack_timeout = ack_timeout_s
        self._ordinal = 0
        self.identity: StepIdentity | None = None
        self._key = (plan.session, 0, 0)  # the claimed (session, turn, step), once claimed
        self._chunk_counter = metrics.chunks.labels(plan.route.provider)
        self._chunks: AsyncGenerator[list[StreamChunk], None] | None = None

    async def begin(self) -> None:
        """Call the provider and take the chunks of its first read: published, and the caller's
        opening and their bytes in the outbox. Raises the :class:`GatewayError` that prevented
        the start, once it is recorded; the step is then over."""
        self._metrics.in_flight.inc()
        route = self.plan.route
        normaliser = self.output.normaliser(route.normaliser())
        self._chunks = self._deps.upstream.stream(route, self.plan.body, normaliser)
        try:
            await self._take(await self._first_batch(self._chunks))
        except asyncio.CancelledError:
            await self._abort()
            await self._end()
            raise
        except BaseException:
            await self._end()
            raise

    async def finish_rest(self) -> None:
        """Read the provider to the end and settle the step; a failure goes to ``error``."""
        assert self._chunks is not None  # begun
        try:
            async for batch in self._chunks:
                await self._take(batch)
            await self._settle()
        except GatewayError as exc:
            self.error = exc
            await self.outbox.put(self.output.failure(exc.message))
        except asyncio.CancelledError:
            await self._abort()
            raise
        finally:
            await self._end()

    async def _first_batch(
        self, batches: AsyncGenerator[list[StreamChunk], None]
    ) -> list[StreamChunk]:
        """The chunks of the first read that brought any."""
        try:
            async for batch in batches:
                if batch:
                    return batch
        except ProviderHTTPError as exc:
            message = scrub(exc.message, self.plan.secrets)
            error = StepError(message=message, retryable=exc.retryable, code=exc.code)
            await self._record_before_start(Finish(reason="error", error=error))
            text = f"provider returned HTTP {exc.status}: {message}"
            raise UpstreamError(text, upstream_status=exc.status, retryable=exc.retryable) from exc
        raise UpstreamError(
            "the provider stream ended without a chunk", upstream_status=None, retryable=True
        )

    async def _end(self) -> None:
        """Whatever way the step ended: counters, the caller's outbox, the provider stream."""
        self._chunk_counter.inc(self._ordinal % _COUNT_EVERY)  # the rest of the count
        self._metrics.in_flight.dec()
        self.outbox.close()
        if self.finish is not None:
            self._metrics.steps.labels(self.finish.reason).inc()
        self.plan.claim.drop()
        if self._chunks is not None:
            await self._chunks.aclose()

    async def _claimed(self) -> StepIdentity:
        """The step's identity, waiting for its claim if it is still running."""
        if self.identity is None:
            identity = await self.plan.claim.identity()  # 503 when the registry is down
            self.identity = identity
            self._key = (identity.session, identity.turn, identity.step)
        return self.identity

    async def _take(self, batch: list[StreamChunk]) -> None:
        """Publish the chunks of one read in order and hand the caller their bytes at once."""
        out: list[bytes] = []
        for chunk in batch:
            if self.finish is not None:
                break  # the adapter contract: nothing after finish
            await self._take_one(chunk, out)
        await self.outbox.put(b"".join(out))

    async def _take_one(self, chunk: StreamChunk, out: list[bytes]) -> None:
        first = self._ordinal == 0
        if isinstance(chunk, Finish):
            chunk = self._scrubbed(chunk)
            if first and chunk.error is not None:
                await self._fail_before_start(chunk, chunk.error)
        await self._publish(chunk)
        if isinstance(chunk, Finish):
            self.finish = chunk
        if first:
            self._observe_first_chunk()
            out.append(self.output.opening())
        out.append(self.output.chunk(chunk))

    def _scrubbed(self, finish: Finish) -> Finish:
        """The finish with credentials removed from its error (providers may echo a key)."""
        if finish.error is None or not self.plan.secrets:
            return finish
        message = scrub(finish.error.message, self.plan.secrets)
        return msgspec.structs.replace(
            finish, error=msgspec.structs.replace(finish.error, message=message)
        )

    async def _fail_before_start(self, finish: Finish, error: StepError) -> None:
        """An error as the very first chunk (e.g. connection refused): record it, answer 502."""
        await self._record_before_start(finish)
        raise UpstreamError(error.message, upstream_status=None, retryable=error.retryable)

    def _observe_first_chunk(self) -> None:
        """The first chunk is on its way to the broker: the time to first chunk is known."""
        elapsed_s = (self._deps.clock_ns() - self.plan.request_time_ns) / 1e9
        self._metrics.ttfc.labels(self.plan.route.provider).observe(max(elapsed_s, 0.0))

    async def _publish(self, chunk: StreamChunk) -> None:
        ident = self.identity or await self._claimed()
        route, ordinal = self.plan.route, self._ordinal
        envelope = ChunkEnvelope(
            session=ident.session, turn=ident.turn, step=ident.step, ordinal=ordinal,
            time_ns=self._deps.clock_ns(), provider=route.provider, model=route.model,
            chunk=chunk, request_time_ns=self.plan.request_time_ns if ordinal == 0 else None,
        )  # fmt: skip
        try:
            await self._deps.sink.publish(
                json_encoder.encode(envelope), *self._key, ordinal,
                first=ordinal == 0, headers=self.plan.trace_headers,
            )  # fmt: skip
        except BrokerError as exc:
            raise BrokerUnavailableError(f"the broker did not accept the step: {exc}") from exc
        self._ordinal += 1
        if self._ordinal % _COUNT_EVERY == 0:
            self._chunk_counter.inc(_COUNT_EVERY)

    async def _record_before_start(self, finish: Finish) -> None:
        """Publish a failed-before-start step as its one ``finish`` chunk, and wait for it."""
        self.finish = finish
        await self._publish(finish)
        await self._wait_acked()

    async def _settle(self) -> None:
        """Wait for the acks, then complete the caller's stream (or fail the step)."""
        started = self._deps.monotonic()
        await self._wait_acked()
        self._metrics.ack_latency.observe(self._deps.monotonic() - started)
        if (
            self.finish is not None
            and self.finish.error is None
            and self.finish.reason != "aborted"
        ):
            await self.outbox.put(self.output.ending())

    async def _wait_acked(self) -> None:
        try:
            await self._deps.sink.wait_acked(*self._key, timeout_s=self._ack_timeout)
        except BrokerError as exc:
            raise BrokerUnavailableError(f"the broker did not acknowledge the step: {exc}") from exc

    async def _abort(self) -> None:
        """Cancelled (the caller left and the step may stop): record ``finish {aborted}``."""
        if self.finish is not None:
            return
        self.finish = Finish(reason="aborted")
        with contextlib.suppress(GatewayError, TimeoutError):
            async with asyncio.timeout(self._ack_timeout):
                await self._publish(self.finish)
                await self._wait_acked()
