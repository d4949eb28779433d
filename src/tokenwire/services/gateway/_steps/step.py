"""One step through the gateway: read the provider to the end, publish every chunk, feed the
caller.

:class:`StepRun` owns the step's whole lifecycle: the claim, the provider call, publishing
(in frames, ``framing.py``), the caller's output (``_output/caller.py``), the caller leaving
(:meth:`StepRun.caller_left`) and cancellation. The app plans the step (:class:`StepPlan`),
calls :meth:`StepRun.start`, and returns :meth:`StepRun.response` (a streaming caller) or,
after :meth:`StepRun.settled`, the folded answer. Two halves, so that nothing between the
request and its first chunk waits for another task: :meth:`StepRun.begin` in the caller's
request task, :meth:`StepRun.finish_rest` as a task of its own. The semantics (order, failed
steps, acknowledgement before the terminator, the caller leaving): docs/gateway.md,
"Publishing semantics".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable
from typing import NoReturn

import msgspec

from tokenwire.broker import (
    BrokerError,
    KeyBinding,
    PayloadTooLarge,
    StepNames,
    ThreadMark,
)
from tokenwire.providers import Normaliser, ProviderHTTPError
from tokenwire.schemas import (
    LIMIT_ERROR_CODE,
    Finish,
    Message,
    StepError,
    StreamChunk,
    TokenUsage,
    Usage,
)
from tokenwire.scrub import scrub as scrub_text
from tokenwire.services.gateway._access.identity import StepIdentity
from tokenwire.services.gateway._errors import (
    BrokerUnavailableError,
    GatewayError,
    StepContractError,
    StepLimitError,
    UpstreamError,
)
from tokenwire.services.gateway._observe.genai import CallObserver
from tokenwire.services.gateway._observe.metrics import GatewayMetrics
from tokenwire.services.gateway._output.caller import (
    CallerOutput,
    FoldingOutput,
    HeadTap,
    Outbox,
    StepStream,
)
from tokenwire.services.gateway._resume.resume import response_alias
from tokenwire.services.gateway._routing.upstream import UpstreamCall
from tokenwire.services.gateway._steps.bounds import StepBounds, StepMeter
from tokenwire.services.gateway._steps.contract import ContractCheck
from tokenwire.services.gateway._steps.deps import GatewayDeps
from tokenwire.services.gateway._steps.envelopes import envelope, frame_heads
from tokenwire.services.gateway._steps.fallback import Attempt, RoutedStep, first_chunks
from tokenwire.services.gateway._steps.fit import ChunkTooLarge, DeltaLedger, fitted
from tokenwire.services.gateway._steps.framing import ChunkTooLargeForFrame, FramePolicy, Framer
from tokenwire.services.gateway._steps.step_plan import StepPlan
from tokenwire.services.gateway._steps.watchdog import Watchdog

log = logging.getLogger("tokenwire.gateway")
DEFAULT_BOUNDS = StepBounds()
DEFAULT_FRAMING = FramePolicy()
ALIAS_TTL_S = 10 * 365 * 24 * 3600.0
"""A Responses id maps to its step for as long as the registry keeps it (its bucket's TTL,
the chunk stream's retention)."""
_ID_GROWTH = 64
"""Bytes kept free in a fitted message for what grows with the ordinal (its envelope field and
the ``Nats-Msg-Id`` header)."""

CONTRACT_ERROR_CODE = "tokenwire_contract"
"""The code of the finish the gateway publishes after a chunk that broke the contract (the
store records the fold's own ``contract`` error, which the chunk before it caused)."""

_COUNT_EVERY = 64
"""Published chunks are added to the Prometheus counter in groups of this many (and the rest
when the step ends): taking the counter's lock per chunk cost ~1% of the gateway's CPU."""


def _not_tried(routing: RoutedStep | None) -> str:
    """A failed routed step's fallbacks its request could not be translated for, and why."""
    return "" if routing is None else routing.not_tried()


def scrub(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every credential value replaced (providers may echo a key back)."""
    return scrub_text(text, secrets)


class StepRun:
    """Runs one planned step; see the module docstring for its semantics."""

    def __init__(
        self,
        *,
        plan: StepPlan,
        output: CallerOutput,
        caller_buffer_bytes: int,
        deps: GatewayDeps,
        metrics: GatewayMetrics,
        ack_timeout_s: float,
        bounds: StepBounds = DEFAULT_BOUNDS,
        call: CallObserver | None = None,
        running: set[asyncio.Task[None]] | None = None,
        framing: FramePolicy = DEFAULT_FRAMING,
    ) -> None:
        self.plan = plan
        self.output = output
        self.route = plan.route  # the call's route: a routed step's may change before its start
        self._upstream = plan.call
        self.forwarded = plan.forwarded  # the serving call speaks the caller's dialect
        self._tokens = 0  # what the usage reported (a routed deployment's tpm)
        self._usage: TokenUsage | None = None
        self._first_byte_s: float | None = None  # the current routed call's first-byte bound
        self.outbox = Outbox(caller_buffer_bytes)  # what the caller's response sends
        self.error: GatewayError | None = None
        self.finish: Finish | None = None
        self._task: asyncio.Task[None] | None = None
        self._running = running if running is not None else set()  # the app's running steps
        self._deps = deps
        self._metrics = metrics
        self._ack_timeout = ack_timeout_s
        self._ordinal = 0
        self.identity: StepIdentity | None = None
        self._key = (plan.session, 0, 0)  # the claimed (session, turn, step), once claimed
        self._chunk_counter = metrics.child(metrics.chunks, plan.route.provider)
        self._chunks: AsyncGenerator[list[StreamChunk], None] | None = None
        self._call = call  # the model call's span and figures (_observe/genai.py)
        self._last_ns = 0  # the time on the last envelope published
        self._ledger = DeltaLedger()
        self._bounds = bounds
        self._meter = StepMeter(bounds)
        # A non-streaming caller's answer is the fold's own; a streaming one is checked.
        self._contract = (
            None if isinstance(output, FoldingOutput) else ContractCheck(bounds.fold_limits())
        )
        self._watchdog: Watchdog | None = None
        self._head: HeadTap | None = None  # the provider's names for the span, when recorded
        self._framing = framing
        self._framer: Framer | None = None  # made at the first publish (needs the event loop)
        self._naming: asyncio.Task[None] | None = None  # keeping the names (a resumable step)
        self._marking: asyncio.Task[None] | None = None  # the answer's thread keys, once it ended

    async def start(self) -> None:
        """Call the provider and take the first chunk in this task (no task switch before the
        first chunk: :meth:`begin`), then go on with the step in a task of its own
        (:meth:`finish_rest`, kept in the app's set of running steps until it ends; the call's
        span ends with the step, see ``_observe/genai.py``)."""
        await self.begin()
        task = asyncio.create_task(self.finish_rest(), name=f"step of session {self.plan.session}")
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        self._task = task

    def response(self) -> StepStream:
        """The streaming caller's response over the step's outbox (a started step)."""
        assert self.identity is not None  # a begun step is claimed
        headers = {**self.identity.headers(), "cache-control": "no-cache"}
        return StepStream(self.outbox, headers, self.caller_left)

    async def settled(self) -> None:
        """Wait for the started step to end (a non-streaming caller); if the caller's request
        is cancelled meanwhile (it left), that is the caller leaving."""
        assert self._task is not None  # started
        try:
            await asyncio.shield(self._task)
        except asyncio.CancelledError:
            self.caller_left()
            raise

    def caller_left(self) -> None:
        """The caller is gone: nothing more is sent to it; the step reads on to the end, or,
        without ``continue_on_disconnect``, is cancelled (it records ``finish {aborted}``)."""
        self.outbox.detach()
        if not self.plan.continue_on_disconnect and self._task is not None:
            self._task.cancel()

    async def begin(self) -> None:
        """Call the provider and take the chunks of its first read: published, and the caller's
        opening and their bytes in the outbox. Raises the :class:`GatewayError` that prevented
        the start, once it is recorded; the step is then over."""
        self._metrics.in_flight.inc()
        self._chunks = self._read(self._upstream)
        try:
            await self._take(await self._bounded_first_batch(self._chunks))
        except asyncio.CancelledError:
            try:
                await self._abort()
            finally:  # cancelled again while recording it, the step still ends (its call let go)
                await self._end()
            raise
        except BaseException as exc:
            if self._call is not None:
                self._call.raised = exc
            await self._end()
            raise

    async def finish_rest(self) -> None:
        """Read the provider to the end and settle the step; a failure goes to ``error``."""
        try:
            await self._read_rest()
            await self._settle()
        except GatewayError as exc:
            self.error = exc
            if exc.detail:  # the caller is told what failed, the log also how
                log.warning("step failed while streaming: %s (%s)", exc.message, exc.detail)
            await self.outbox.put(self.output.failure(exc.message))
        except asyncio.CancelledError:
            await self._abort()
            raise
        finally:
            await self._end()

    async def _read_rest(self) -> None:
        """Take the provider's chunks until its finish, within the step's time bounds."""
        assert self._chunks is not None  # begun
        watchdog = self._watch()
        if (expired := watchdog.overdue()) is not None:  # ran out as the first chunks went
            await self.stop_at_limit(expired)
        watchdog.reading = True
        try:
            async for batch in self._chunks:  # the watchdog may cancel only this wait
                watchdog.reading = False
                if (rest := self._take_now(batch)) is not None:
                    await rest
                if self.finish is not None:
                    return  # nothing after finish: the rest is not read
                if batch:
                    watchdog.chunk_seen()
                else:  # a read that brought no chunk: what it forwards is not kept
                    await self.outbox.put(self.output.idle())
                if (expired := watchdog.overdue()) is not None:
                    await self.stop_at_limit(expired)
                watchdog.reading = True
        except asyncio.CancelledError:
            await self._limit_if_expired(watchdog)

    def _watch(self) -> Watchdog:
        """The step's watchdog, watching the current task (begin and the rest run in two)."""
        task = asyncio.current_task()
        assert task is not None  # called from a coroutine
        if self._watchdog is None:
            bounds = self._bounds
            self._first_byte_s = self._first_byte_bound()
            self._watchdog = Watchdog(
                task, bounds.max_seconds, bounds.max_idle_seconds, self._first_byte_s
            )
        self._watchdog.watch(task)
        return self._watchdog

    async def _limit_if_expired(self, watchdog: Watchdog) -> NoReturn:
        """A cancellation the watchdog made ends the step at its bound; any other goes on."""
        task = asyncio.current_task()
        if not watchdog.fired or task is None or watchdog.expired is None:
            raise  # noqa: PLE0704 - called from an except block: re-raises the cancellation
        watchdog.fired = False
        task.uncancel()
        await self.stop_at_limit(watchdog.expired)

    async def _bounded_first_batch(
        self, batches: AsyncGenerator[list[StreamChunk], None]
    ) -> list[StreamChunk]:
        """:meth:`_first_batch` within the step's time bounds (a limit error past them)."""
        watchdog = self._watch()
        try:
            batch = await self._first_batch(batches)
        except asyncio.CancelledError:
            await self._limit_if_expired(watchdog)
        watchdog.reading = False
        watchdog.chunk_seen()
        return batch

    async def _first_batch(
        self, batches: AsyncGenerator[list[StreamChunk], None]
    ) -> list[StreamChunk]:
        """The chunks of the first read that brought any. A routed step whose call fails
        before it is given the next deployment's call (``_steps/fallback.py``); the failure
        no call follows is the step's answer, recorded."""
        while True:
            try:
                batch = await first_chunks(batches, self._watchdog, self._first_byte_s)
            except ProviderHTTPError as exc:
                routing = self.plan.routing
                attempt = await routing.after_http_error(exc) if routing else None
                if attempt is None:
                    await self._fail_with_status(exc)
                batches = await self._switch(attempt)
                continue
            routing = self.plan.routing
            attempt = await routing.after_first_read(batch) if routing else None
            if attempt is not None:
                batches = await self._switch(attempt)
                continue
            if not batch:
                raise UpstreamError(
                    "the provider stream ended without a chunk",
                    upstream_status=None,
                    retryable=True,
                )
            return batch

    def _first_byte_bound(self) -> float | None:
        """The current routed call's first-byte bound (None: none, nothing would follow)."""
        routing = self.plan.routing
        return None if routing is None else routing.first_byte_timeout_s()

    async def _switch(self, attempt: Attempt) -> AsyncGenerator[list[StreamChunk], None]:
        """Go on with the next call: its route, its caller output and its chunks."""
        if self._chunks is not None:
            await self._chunks.aclose()
        self._upstream.cancel()
        self.route, self.output, self._upstream = attempt.route, attempt.output, attempt.call
        self.forwarded = attempt.forwarded
        self._chunk_counter = self._metrics.child(self._metrics.chunks, self.route.provider)
        if self._watchdog is not None:
            self._first_byte_s = self._first_byte_bound()
            self._watchdog.first_byte_within(self._first_byte_s)
        if self._call is not None:
            self._call.route = self.route
        self._chunks = self._read(attempt.call)
        return self._chunks

    def _read(self, call: UpstreamCall) -> AsyncGenerator[list[StreamChunk], None]:
        """The call's chunks, read with the route's normaliser through the caller's output."""
        normaliser = self._head_read(self.output.normaliser(self.route.normaliser()))
        return call.batches(normaliser, self.plan.coalesce_s)

    async def _fail_with_status(self, exc: ProviderHTTPError) -> NoReturn:
        """The provider's HTTP error before any chunk is the step's answer: recorded."""
        if self._call is not None:
            self._call.http_status = exc.status
        if self._watchdog is not None:
            self._watchdog.reading = False  # publishing from here: never cancelled midway
        message = scrub(exc.message, self.plan.secrets)
        error = StepError(message=message, retryable=exc.retryable, code=exc.code)
        await self._record_before_start(Finish(reason="error", error=error))
        text = f"provider returned HTTP {exc.status}: {message}{_not_tried(self.plan.routing)}"
        raise UpstreamError(
            text, upstream_status=exc.status, retryable=exc.retryable, relay_headers=exc.headers
        ) from exc

    def _head_read(self, normaliser: Normaliser) -> Normaliser:
        """``normaliser``, reading the provider's response id and model off its first events
        for the call's span when spans are recorded (the non-streaming answer reads its own)."""
        recording = self._call is not None and self._call.calls.recording
        if not recording and self.plan.naming is None:
            return normaliser
        self._head = HeadTap(normaliser)
        return self._head

    def _name_step(self) -> None:
        """Keep the resumable step's names with its claim (in a task of its own: nothing
        waits for it; a resumer that finds no names yet reads them again)."""
        if self.plan.naming is None:
            return
        names = self.plan.naming(self._head, self.forwarded)
        task = asyncio.create_task(self._named(names))
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        self._naming = task

    async def _named(self, names: StepNames) -> None:
        """Keep the names with the claim and, for a Responses answer, map its id to the step
        (both at once; bounded by the ack timeout, a failure logged)."""
        steps = self._deps.steps
        writes: list[Awaitable[object]] = [steps.name_step(*self._key, names)]
        if self.plan.aliased and names.response_id is not None:
            alias = KeyBinding(*self._key, fingerprint="")
            writes.append(steps.bind_key(response_alias(names.response_id), alias, ALIAS_TTL_S))
        try:
            async with asyncio.timeout(self._ack_timeout):
                await asyncio.gather(*writes)
        except (BrokerError, TimeoutError) as exc:
            log.warning("the names of step %s/%s/%s were not kept: %s", *self._key, exc)

    async def _names_kept(self) -> None:
        """Wait, where the caller's first bytes name the provider's id, until that id maps
        to the step (``StepPlan.names_before_bytes``)."""
        if self.plan.names_before_bytes and self._naming is not None:
            await asyncio.shield(self._naming)

    async def _end(self) -> None:
        """Whatever way the step ended: counters, the caller's outbox, the provider stream."""
        self._chunk_counter.inc(self._ordinal % _COUNT_EVERY)  # the rest of the count
        self._metrics.in_flight.dec()
        self.outbox.close()
        if self.finish is not None:
            self._metrics.child(self._metrics.steps, self.finish.reason).inc()
        if self._call is not None:
            if self._head is not None:
                self._call.response_id = self._head.response_id
                self._call.response_model = self._head.model
            turn_step = self._key[1:] if self.identity is not None else None
            if self.plan.routing is not None:
                self._call.routed = self.plan.routing.routed()
            self._call.end(self.finish, self.error, self._ordinal, self._deps.clock_ns(), turn_step)
        self.plan.claim.drop()
        if self.plan.routing is not None:
            self.plan.routing.ended(self._tokens)
        if self.plan.on_end is not None:
            routed = self.plan.routing.routed() if self.plan.routing is not None else None
            self.plan.on_end(self._usage, self.route, routed, self._ordinal > 0)
        if self._framer is not None:
            self._framer.close()
        if self._watchdog is not None:
            self._watchdog.stop()
        if self._chunks is not None:
            await self._chunks.aclose()
        self._upstream.cancel()  # a call never read is let go (nothing once read)

    async def _claimed(self) -> StepIdentity:
        """The step's identity, waiting for its claim if it is still running."""
        if self.identity is None:
            identity = await self.plan.claim.identity()  # 503 when the registry is down
            self.identity = identity
            self._key = (identity.session, identity.turn, identity.step)
        return self.identity

    async def _take(self, batch: list[StreamChunk]) -> None:
        """Publish the chunks of one read in order and hand the caller their bytes at once."""
        if (rest := self._take_now(batch)) is not None:
            await rest

    def _take_now(self, batch: list[StreamChunk]) -> Awaitable[None] | None:
        """:meth:`_take` as far as it goes without waiting; None once the read is taken (the
        usual read: its chunks join the open frame, the frame lingers, the caller's socket
        takes the bytes), else what is left of it, to await. No coroutine for the usual read:
        paced streams bring one token a read, and a coroutine per read is a frame to create
        and run (bench/bench_step_path.py)."""
        out: list[bytes] = []
        opened = self._ordinal == 0  # this read brings the first chunk (the caller's opening)
        for i, read in enumerate(batch):
            if self.finish is not None:
                break  # the adapter contract: nothing after finish
            crossed = self._meter.over(read, self._ordinal)
            # Most chunks join the open frame without a wait: no coroutine per chunk.
            if crossed is not None or not self._framed_now(read):
                return self._take_rest(batch, i, out, opened, crossed)
            if (broken := self._taken(read, False, out)) is not None:
                return self._take_rest(batch, i + 1, out, opened, None, broken)
        if opened or (self._framer is not None and self._framer.read_done()):
            return self._take_rest(batch, len(batch), out, opened, None)
        out.append(self.output.flush())
        data = b"".join(out)
        return None if self.outbox.put_now(data) else self.outbox.put(data)

    async def _take_rest(
        self,
        batch: list[StreamChunk],
        start: int,
        out: list[bytes],
        opened: bool,
        crossed: str | None,
        broken: str | None = None,
    ) -> None:
        """The rest of :meth:`_take_now`'s read from ``batch[start]``, which is metered (the
        bound it ``crossed``) and not framed; or, with ``broken`` (the contract the chunk
        before it broke), not metered yet."""
        metered = start if broken is None else -1  # the chunk counted against the bounds
        try:
            if broken is not None:
                await self._stop_broken(broken)
            for i in range(start, len(batch)):
                read = batch[i]
                if self.finish is not None:
                    break  # the adapter contract: nothing after finish
                first = self._ordinal == 0
                if i != metered:
                    crossed = self._meter.over(read, self._ordinal)
                chunk = read
                if i == metered or crossed is not None or not self._framed_now(read):
                    chunk = await self._publish_one(read, crossed, first)
                if (broken := self._taken(chunk, first, out)) is not None:
                    await self._stop_broken(broken)
            if self._framer is not None and self._framer.read_done():
                await self._framer.flush()  # the frame goes now (else it lingers)
        except GatewayError:  # a bound or the broker stopped the step mid-read
            out.append(self.output.flush())  # the caller gets what was published
            await self.outbox.put(b"".join(out))
            raise
        out.append(self.output.flush())
        if opened:
            await self._names_kept()
        await self.outbox.put(b"".join(out))

    async def _publish_one(
        self, chunk: StreamChunk, crossed: str | None, first: bool
    ) -> StreamChunk:
        """Publish a chunk that did not join the open frame at once (the first, a finish, a
        full frame, frames off), or stop at the bound it ``crossed``; returns the chunk as
        published (a finish without credentials)."""
        if crossed is not None:
            await self.stop_at_limit(crossed)
        if isinstance(chunk, Finish):
            chunk = self._scrubbed(chunk)
            if first and chunk.error is not None:
                await self._fail_before_start(chunk, chunk.error)
        await self._publish(chunk)
        return chunk

    def _taken(self, chunk: StreamChunk, first: bool, out: list[bytes]) -> str | None:
        """A published chunk's bookkeeping and its bytes for the caller; the contract it
        broke instead, if it did (nothing then goes to the caller for it)."""
        if isinstance(chunk, Finish):
            self.finish = chunk
        elif isinstance(chunk, Usage):
            self._tokens = chunk.usage.total()
            self._usage = chunk.usage
            if self._call is not None:
                self._call.usage = chunk.usage
        if self._contract is not None and (broken := self._contract.feed(chunk)) is not None:
            return broken
        if first:
            self._observe_first_chunk()
            if self.plan.routing is not None:
                self.plan.routing.answered()
            self._name_step()
            out.append(self.output.opening())
        out.append(self.output.chunk(chunk))
        if isinstance(chunk, Finish):
            self._mark_thread()
        return None

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
        message = error.message + _not_tried(self.plan.routing)
        raise UpstreamError(message, upstream_status=None, retryable=error.retryable)

    def _observe_first_chunk(self) -> None:
        """The first chunk (not an error: that raised before) is on its way to the broker: the
        stream started, and the time to first chunk is its envelope's time."""
        if self._call is not None:
            self._call.first_chunk(self._last_ns, self.plan.request_time_ns)

    async def _publish(self, chunk: StreamChunk) -> None:
        ident = self.identity or await self._claimed()
        if not self._framing.frames:
            try:
                await self._publish_encoded(self._encode(ident, chunk))
            except PayloadTooLarge as exc:
                await self._publish_fitted(ident, chunk, exc.room - _ID_GROWTH)
        else:
            await self._frame(ident, chunk)
        self._ledger.note(chunk)

    def _framed_now(self, chunk: StreamChunk) -> bool:
        """Publish ``chunk`` into the step's open frame without waiting, as :meth:`_publish`
        would: most chunks of a step (a delta past the first chunk, with room in the frame).
        False, nothing changed, for any other: the first chunk and a finish (they go at once),
        a full frame (it goes first), a chunk to fit, frames off (no framer)."""
        framer = self._framer
        if framer is None or self._ordinal == 0 or type(chunk) is Finish:
            return False
        now = self._deps.clock_ns()
        try:
            if not framer.append(chunk, self._ordinal, now):
                return False
        except ChunkTooLargeForFrame:
            return False
        self._last_ns = now
        self._counted()
        self._ledger.note(chunk)
        return True

    async def _frame(self, ident: StepIdentity, chunk: StreamChunk) -> None:
        """Add the chunk to the step's frame (fitted first when it fits in no frame); the
        first chunk and a finish go at once."""
        framer = self._framer or self._new_framer(ident)
        self._last_ns = now = self._deps.clock_ns()
        try:
            await self._framed(framer, chunk, now)
        except ChunkTooLargeForFrame:
            ordinal = self._ordinal
            try:
                pieces = fitted(
                    chunk, lambda c: framer.fits_alone(c, ordinal, now, _ID_GROWTH), self._ledger
                )
            except ChunkTooLarge as exc:
                await self.stop_at_limit(f"the step exceeded the broker's message size: {exc}")
            for piece in pieces:
                await self._framed(framer, piece, now)
        if isinstance(chunk, Finish):
            await framer.flush()

    async def _framed(self, framer: Framer, chunk: StreamChunk, now: int) -> None:
        await framer.add(chunk, self._ordinal, now)
        self._counted()
        if self._ordinal == 1:
            await framer.flush()  # the first chunk goes alone, at once (on ``.first``)

    def _counted(self) -> None:
        """One more chunk published (the Prometheus counter moves in groups)."""
        self._ordinal += 1
        if self._ordinal % _COUNT_EVERY == 0:
            self._chunk_counter.inc(_COUNT_EVERY)

    def _new_framer(self, ident: StepIdentity) -> Framer:
        head = frame_heads(self.plan, self.route, ident, self._deps.sink)
        self._framer = Framer(self._framing.linger_ms / 1000, head, self._send_frame)
        return self._framer

    async def _send_frame(self, payload: bytes, ordinal: int) -> None:
        try:
            await self._deps.sink.publish(
                payload,
                *self._key,
                ordinal,
                first=ordinal == 0,
                headers=self.plan.trace_headers if ordinal == 0 else None,
            )
        except BrokerError as exc:  # PayloadTooLarge included: the framer counted every byte
            raise BrokerUnavailableError(
                "the broker did not accept the step", detail=str(exc)
            ) from exc

    def _encode(self, ident: StepIdentity, chunk: StreamChunk) -> bytes:
        self._last_ns = self._deps.clock_ns()
        return envelope(
            self.plan, self.route, ident, chunk, ordinal=self._ordinal, time_ns=self._last_ns
        )

    async def _publish_encoded(self, envelope_bytes: bytes) -> None:
        ordinal = self._ordinal
        try:
            await self._deps.sink.publish(
                envelope_bytes,
                *self._key,
                ordinal,
                first=ordinal == 0,
                headers=self.plan.trace_headers if ordinal == 0 else None,
            )
        except PayloadTooLarge:
            raise
        except BrokerError as exc:
            raise BrokerUnavailableError(
                "the broker did not accept the step", detail=str(exc)
            ) from exc
        self._counted()

    async def _publish_fitted(self, ident: StepIdentity, chunk: StreamChunk, room: int) -> None:
        """A chunk over the broker's message size: split, by reference, or the step's end."""
        try:
            pieces = fitted(chunk, lambda c: len(self._encode(ident, c)) <= room, self._ledger)
        except ChunkTooLarge as exc:
            await self.stop_at_limit(f"the step exceeded the broker's message size: {exc}")
        for piece in pieces:
            await self._publish_encoded(self._encode(ident, piece))

    async def stop_at_limit(self, message: str) -> NoReturn:
        """End the step at a gateway bound: record ``finish {error: tokenwire_limit}``, then
        raise :class:`StepLimitError` (the caller is told in its dialect)."""
        error = StepError(message=message, retryable=False, code=LIMIT_ERROR_CODE)
        self.finish = Finish(reason="error", error=error)
        await self._publish_finish(self.finish)
        await self._wait_acked()
        raise StepLimitError(message)

    async def _stop_broken(self, message: str) -> NoReturn:
        """The fold calls the step broken (see ``_steps/contract.py``): it is recorded so (a finish
        with an error after the chunk that broke it, unless the finish itself revealed it),
        and the caller is told the fold's message in its dialect, never a normal end."""
        if self.finish is None:
            error = StepError(message=message, retryable=False, code=CONTRACT_ERROR_CODE)
            self.finish = Finish(reason="error", error=error)
            await self._publish_finish(self.finish)
        await self._wait_acked()
        raise StepContractError(message)

    async def _publish_finish(self, finish: Finish) -> None:
        """The finish the gateway adds (a bound, a contract break): after what is held."""
        ident = await self._claimed()
        if self._framing.frames:
            await self._frame(ident, finish)
        else:
            await self._publish_encoded(self._encode(ident, finish))

    async def _record_before_start(self, finish: Finish) -> None:
        """Publish a failed-before-start step as its one ``finish`` chunk, and wait for it."""
        self.finish = finish
        await self._publish(finish)
        await self._wait_acked()

    def _mark_thread(self) -> None:
        """The step answered: its thread keys go to the registry now, beside the chunks' acks
        (the caller's stream ends once they are written: its next request finds them)."""
        thread, answer = self.plan.thread, self._answer()
        if thread is None or answer is None or self.identity is None:
            return
        naming = self.plan.naming
        names = naming(self._head, self.forwarded) if naming is not None else None
        response_id = names.response_id if names is not None and self.plan.aliased else None
        try:
            keys = thread.marks(answer, response_id)
        except Exception as exc:  # threading never fails a step: its answer is not found
            log.warning("the thread keys of step %s/%s/%s were not made: %r", *self._key, exc)
            return
        if not keys:
            return
        mark = ThreadMark(*self._key, pointer=self._deps.steps.pointer(self.identity.session))
        self._marking = asyncio.create_task(self._deps.steps.mark_thread(keys, mark))

    def _answer(self) -> Message | None:
        """The step's folded answer once it finished (None: it failed)."""
        if self._contract is not None:
            result = self._contract.result()
        elif isinstance(self.output, FoldingOutput):
            result = self.output.result()
        else:
            return None
        return result if isinstance(result, Message) else None

    async def _marked(self) -> None:
        """Wait (bounded) for the thread keys; a failure only costs the threading."""
        if self._marking is None:
            return
        try:
            async with asyncio.timeout(self._ack_timeout):
                await self._marking
        except (BrokerError, TimeoutError) as exc:
            log.warning("the thread keys of step %s/%s/%s were not kept: %s", *self._key, exc)

    async def _settle(self) -> None:
        """Wait for the acks, then complete the caller's stream (or fail the step)."""
        started = self._deps.monotonic()
        await self._wait_acked()
        self._metrics.ack_latency.observe(self._deps.monotonic() - started)
        await self._marked()
        if (
            self.finish is not None
            and self.finish.error is None
            and self.finish.reason != "aborted"
        ):
            self.outbox.end(self.output.ending())  # sent with the body's end, in one write

    async def _wait_acked(self) -> None:
        if self._framer is not None:
            await self._framer.flush()  # every chunk taken is on its way first
        try:
            await self._deps.sink.wait_acked(*self._key, timeout_s=self._ack_timeout)
        except BrokerError as exc:
            raise BrokerUnavailableError(
                "the broker did not acknowledge the step", detail=str(exc)
            ) from exc

    async def _abort(self) -> None:
        """Cancelled (the caller left and the step may stop): record ``finish {aborted}``."""
        if self.finish is not None:
            return
        self.finish = Finish(reason="aborted")
        with contextlib.suppress(GatewayError, TimeoutError):
            async with asyncio.timeout(self._ack_timeout):
                await self._publish(self.finish)
                await self._wait_acked()
