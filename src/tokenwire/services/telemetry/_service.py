"""The telemetry consumer: the first chunk of every step in, a stream-started signal out.

The broker does the selection: the durable consumer's filter is the first-chunk subject
(``<prefix>.chunks.*.*.first``), so deliveries equal steps, whatever the number of tokens.
Each signal is published to ``<prefix>.events.<r>.<session>.started`` with the dedupe id
``started:<session>:<turn>:<step>``; the PubAck's ``duplicate`` flag tells a redelivery (after
a crash between publish and ack, or a restart) from a new start, so metrics count each step
once without any state of our own surviving the restart. The duplicate window closes 120 s
after the publish, so a *redelivered* first chunk is also checked against the stored events
(``broker.stored_with_msg_id``): a signal published before a crash is never sent twice,
whatever the timing.
``after_publish`` is a seam for fault injection (a crash between publish and ack). Sequence
gaps on this path are normal.

Control flow per message (PRINCIPLES.md, 6): the handler returns (ack), raises ``Reject``
(undecodable: terminated and dead-lettered by the consumer loop) or ``Retry`` (the signal
could not be published: nak with a delay).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec

from tokenwire.broker import (
    BrokerError,
    Connection,
    ConsumedMessage,
    PullConsumer,
    PullSettings,
    Reject,
    Restorer,
    Retry,
    Topology,
    consumer_state,
    ended,
    missing,
    publish_acked,
    stored_with_msg_id,
    stream_missing,
)
from tokenwire.schemas import (
    ChunkEnvelope,
    StepError,
    StreamStarted,
    chunk_envelopes,
    json_encoder,
)
from tokenwire.services.telemetry._errors import TelemetryLoopError
from tokenwire.services.telemetry._otel import OtelSignals
from tokenwire.services.telemetry._prometheus import TelemetryMetrics
from tokenwire.services.telemetry._ready import NOT_STARTED, REASONS, Facts, Readiness, assess
from tokenwire.services.telemetry._signal import failed_call, stream_started

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT_S = 5.0
RETRY_DELAY_S = 1.0
LAG_POLL_S = 2.0
UNANSWERED_MAX = 10_000
"""Signals whose publish failed, remembered until their redelivery (the oldest forgotten)."""


@dataclass
class TelemetryConsumer:
    """Turns first chunks into signals; one instance per process.

    ``publish_timeout_s`` bounds each wait on the broker; the pull loop's ``batch`` bounds how
    many first chunks are held at once. The first chunks delivered together are handled side
    by side (``PullSettings.concurrent``: steps' signals need no order among themselves), so
    their publishes and acks overlap instead of paying a broker round trip each in turn.
    """

    nc: Connection
    topology: Topology
    metrics: TelemetryMetrics
    otel: OtelSignals | None = None
    live: Callable[[str, bytes], Awaitable[None]] | None = None
    publish_timeout_s: float = PUBLISH_TIMEOUT_S
    pull: PullSettings = field(default_factory=lambda: PullSettings(concurrent=True))
    after_publish: Callable[[ConsumedMessage], Awaitable[None]] | None = None
    reprovision: Callable[[], Awaitable[None]] | None = None
    """For a process that provisions: provision again when a chunk stream is missing."""
    clock: Callable[[], float] = time.monotonic
    _answered_at: float | None = None
    _waited_s: float = 0.0
    _missing: set[str] = field(default_factory=set)
    _unanswered: dict[str, None] = field(default_factory=dict)
    _restorer: Restorer | None = None
    _readiness: Readiness = NOT_STARTED

    def readiness(self) -> Readiness:
        """As last assessed (after every lag poll); safe from the probe server's thread."""
        return self._readiness

    def probe(self) -> tuple[bool, str]:
        """``/readyz``: whether ready, and the line it answers with."""
        readiness = self._readiness
        return readiness.ready, readiness.body()

    def assess(self) -> Readiness:
        """Assess the readiness now and export it (``_ready.py``)."""
        age = None if self._answered_at is None else self.clock() - self._answered_at
        facts = Facts(
            self.nc.is_connected, age, LAG_POLL_S, self._waited_s, frozenset(self._missing)
        )
        readiness = assess(facts)
        self._readiness = readiness
        self.metrics.ready.set(1 if readiness.ready else 0)
        for reason in REASONS:
            self.metrics.not_ready.labels(reason).set(1 if reason in readiness.reasons else 0)
        return readiness

    async def handle(self, msg: ConsumedMessage) -> None:
        """Signal one first chunk (see the module docstring for the outcomes)."""
        try:
            envelope = chunk_envelopes(msg.data)[0]  # the step's first chunk travels alone
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.metrics.dead_lettered.inc()
            raise Reject(f"undecodable chunk envelope: {exc}") from exc
        error = failed_call(envelope)
        if error is not None:
            self._record_failure(envelope, error, msg.headers)
            return
        signal = stream_started(envelope, msg.headers.get("traceparent"))
        payload = json_encoder.encode(signal)
        msg_id = f"started:{signal.session}:{signal.turn}:{signal.step}"
        if msg.num_delivered > 1 and await self._signaled_before(signal.session, msg_id):
            duplicate = True  # published before a crash (after the window), or unanswered
        else:
            duplicate = await self._publish(signal.session, payload, msg_id)
            if self.after_publish is not None:
                await self.after_publish(msg)  # the fault-injection seam: published, not acked
        if duplicate and msg_id not in self._unanswered:
            self.metrics.duplicates.inc()
        else:
            self._unanswered.pop(msg_id, None)
            await self._record(signal, payload)

    async def _publish(self, session: str, payload: bytes, msg_id: str) -> bool:
        """Publish the signal; True when the stream already had it. A failed publish may have
        been stored all the same (its PubAck lost): its msg id is remembered, so the
        redelivery that finds it stored counts it instead of taking it for a duplicate."""
        try:
            return await publish_acked(
                self.nc,
                self.topology.event_subject(session, "started"),
                payload,
                headers={"Nats-Msg-Id": msg_id},
                timeout_s=self.publish_timeout_s,
            )
        except BrokerError as exc:
            self._unanswered[msg_id] = None
            if len(self._unanswered) > UNANSWERED_MAX:
                del self._unanswered[next(iter(self._unanswered))]
            log.warning("telemetry publish failed, will retry: %s", exc)
            raise Retry(RETRY_DELAY_S) from exc

    def _record_failure(
        self, envelope: ChunkEnvelope, error: StepError, headers: dict[str, str]
    ) -> None:
        """A failed call: counted (at least once: no signal is published to dedupe it), never a
        stream start or a time-to-first-chunk sample."""
        error_type = self.metrics.record_failure(envelope, error)
        if self.otel is not None:
            self.otel.record_failure(envelope, error_type, headers)

    async def _signaled_before(self, session: str, msg_id: str) -> bool:
        """A redelivery: is its signal already stored? (Retry when unknown)"""
        subject = self.topology.event_subject(session, "started")
        try:
            stream = self.topology.events_stream_of(session)
            return await stored_with_msg_id(
                self.nc, stream, subject, msg_id, timeout_s=self.publish_timeout_s
            )
        except BrokerError as exc:
            log.warning("telemetry redelivery check failed, will retry: %s", exc)
            raise Retry(RETRY_DELAY_S) from exc

    async def _record(self, signal: StreamStarted, payload: bytes) -> None:
        self.metrics.record(signal)
        if self.otel is not None:
            self.otel.record(signal)
        if self.live is not None:
            try:  # the live copy is core NATS, best effort: the stored signal is the record
                await self.live(self.topology.telemetry_live_subject, payload)
            except BrokerError as exc:
                log.warning("live signal not sent: %s", exc)

    def consumer(self, stream: str | None = None) -> PullConsumer:
        """The callback-driven pull loop over the durable ``telemetry`` consumer of one shard
        stream (default: the first)."""
        t = self.topology
        return PullConsumer(
            self.nc,
            stream or t.chunk_streams[0],
            t.telemetry_consumer,
            self.handle,
            settings=self.pull,
            dlq_subject=t.dlq_subject(t.telemetry_consumer),
        )

    async def run(self, stop: asyncio.Event, burst: bool = False) -> None:
        """Consume every shard stream's ``telemetry`` consumer until ``stop`` is set (or, with
        ``burst``, until nothing is pending on any of them)."""
        consumers = [self.consumer(s) for s in self.topology.chunk_streams]
        try:
            for consumer in consumers:
                await consumer.start()
            while not stop.is_set():
                _check_loops(consumers)
                pending = await self._pending()
                self.assess()
                if pending is not None:
                    self.metrics.lag.set(pending[0])
                    buffered = sum(c.buffered for c in consumers)
                    if burst and pending == (0, 0) and buffered == 0:
                        return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.2 if burst else LAG_POLL_S)
        finally:
            await asyncio.gather(*(c.stop() for c in consumers))

    async def _pending(self) -> tuple[int, int] | None:
        """(not yet delivered, delivered but unacked) over every shard's consumer, or None
        when the broker did not answer for one of them. A consumer the broker says is
        missing is created again (bounded, logged: ``broker.Restorer``)."""
        t = self.topology
        states = []
        for stream in t.chunk_streams:
            name = f"{stream}/{t.telemetry_consumer}"
            try:
                states.append(await consumer_state(self.nc, stream, t.telemetry_consumer))
            except BrokerError as exc:
                if missing(exc) and not await self._restore(stream, exc):
                    self._missing.add(name)
                return None
            self._missing.discard(name)
        self._answered_at = self.clock()
        self._waited_s = max(s.waited_s() for s in states)
        self.metrics.lag_seconds.set(self._waited_s)
        return sum(s.num_pending for s in states), sum(s.num_ack_pending for s in states)

    async def _restore(self, stream: str, exc: BrokerError) -> bool:
        """The broker said ``stream``'s telemetry consumer (or the stream) is missing."""
        restorer = self._restorer = self._restorer or Restorer(self.nc, self.topology)
        if stream_missing(exc):
            if self.reprovision is None:
                return False
            restored = await restorer.provision(self.reprovision)
        else:
            restored = await restorer.telemetry_consumer(stream)
        if restored == "restored":
            self.metrics.restored.inc()
        return restored in ("restored", "present")


def _check_loops(consumers: list[PullConsumer]) -> None:
    """Raise :class:`TelemetryLoopError` when a consumer's pull or worker loop ended (they run
    until the consumer's stop: an end is an error they let out)."""
    if (end := ended(t for c in consumers for t in c.loops)) is not None:
        name, reason, exc = end
        raise TelemetryLoopError(name, reason) from exc
