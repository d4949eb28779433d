"""The assembler service: partition handlers around one Assembly, one Committer, and the loops.

Per batch of delivered messages (one partition at a time, in delivery order), per message:
decode once (a v1 envelope, or a v2 frame of one step's chunks: ``chunk_envelopes``) ->
screen (a step waiting for its commit, a step already stored) -> feed the Assembly each
chunk with the message's token -> closed steps go to the Committer, poison goes to the
dead-letter subject. The consumers never ack (manual-ack mode); the Committer acks after the
commit. See docs/assembler.md.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, assert_never

import msgspec

from tokenwire.broker import (
    BatchHandler,
    Connection,
    ConsumedMessage,
    ConsumerState,
    EventPublisher,
    PullSettings,
    Restorer,
    StepClaims,
    Topology,
    dead_letter,
    nak_many,
    parse_stored_subject,
    partition_of,
)
from tokenwire.leftovers import counted
from tokenwire.observability import OtelProviders, no_otel
from tokenwire.schemas import (
    ChunkEnvelope,
    ErrorEvent,
    MessageEvent,
    StepPersisted,
    chunk_envelopes,
    json_encoder,
)
from tokenwire.services.assembler._assembly import (
    Assembly,
    ClosedStep,
    Outcome,
    Poisoned,
    Settled,
    StepKey,
)
from tokenwire.services.assembler._committer import CommitPolicy, Committer
from tokenwire.services.assembler._consume import Delivery, PartitionSet, nak_tokens
from tokenwire.services.assembler._errors import ReadBackError
from tokenwire.services.assembler._expiry import Expiry, PartitionView, Unanswered, partition_view
from tokenwire.services.assembler._lag import LagPoll
from tokenwire.services.assembler._members import MemberBoard, member_name
from tokenwire.services.assembler._metrics import AssemblerMetrics
from tokenwire.services.assembler._provision import provision
from tokenwire.services.assembler._ready import NOT_STARTED, REASONS, Facts, Readiness, assess
from tokenwire.services.assembler._rebalance import Rebalancer
from tokenwire.services.assembler._restoring import Restoring
from tokenwire.services.assembler._settings import AssemblerSettings
from tokenwire.services.assembler._stranded import Stranded
from tokenwire.services.assembler._takeover import ReadBackCause, partition_state, read_back
from tokenwire.services.assembler._trace import StepTraces
from tokenwire.store import CommittedStep, Store, StoreConfigError, StoreUnavailable

log = logging.getLogger(__name__)

DLQ_CONSUMER = "assembler"
"""Poison goes to ``<prefix>.dlq.assembler``."""

READ_BACK_ATTEMPTS = 5
"""Tries at one read-back (consumer info, then the range) before giving up on it: a take-over
then hands its batch back (redelivered after ``backoff_max_s``, and tried again)."""


class Assembler:
    """One assembler instance. ``start()``, then ``close()``; or use :func:`run`.

    ``nc`` and ``store`` are owned by the caller. ``clock`` (Unix ns) drives the step
    timeouts and ``completed_ns``.
    """

    def __init__(
        self,
        settings: AssemblerSettings,
        nc: Connection,
        store: Store,
        *,
        metrics: AssemblerMetrics | None = None,
        clock: Callable[[], int] = time.time_ns,
        otel: OtelProviders | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or AssemblerMetrics()
        self.assembly: Assembly[Delivery] = Assembly(settings.assembly, clock=clock)
        self._nc = nc
        self._store = store
        self._events = EventPublisher(nc, on_given_up=self.metrics.events_given_up.inc)
        self.metrics.events_pending.set_function(lambda: self._events.pending)
        self._clock = clock
        self.traces = StepTraces(otel or no_otel())  # spans per commit
        t = settings.topology
        self._dlq_subject = t.dlq_subject(DLQ_CONSUMER)
        self.committer = Committer(
            store,
            _policy(settings),
            self.metrics,
            announce=self._announce,
            dead_letter=self._dead_letter,
            forget=self.assembly.forget_closed,
        )
        pull = PullSettings(
            batch=settings.pull_batch,
            max_deliver=settings.max_deliver,
            auto_ack=False,
            pin_keepalive_s=min(1.0, settings.priority_timeout_s / 3),
        )
        self.partitions = PartitionSet(nc, t, self._handler_for, pull)
        self.member = member_name(settings.member)
        self.restorer = Restorer(nc, t)
        restoring = Restoring(
            self.restorer, settings, self.metrics, lambda: provision(self._nc, settings)
        )
        self.board = MemberBoard(nc, t, restore=restoring.members)
        self.lag = LagPoll(nc, t, self.metrics, restoring.partition)
        self.expiry = Expiry(
            self.assembly,
            self._partition_view,
            StepClaims(nc, t),
            lambda session: partition_of(session, t.partitions),
        )
        self.rebalancer = Rebalancer(
            self.board,
            self.partitions,
            self.member,
            t.partitions,
            self.metrics,
            in_flight=self._in_flight,
            hand_over=self.hand_over,
            hold_s=settings.member_ttl_s,
        )
        self.stranded = Stranded(nc, t, self.metrics)
        self._locks: dict[int, asyncio.Lock] = {}
        self._seen: dict[int, tuple[str, int]] = {}  # partition -> (pin, consumer seq) handled
        self._suspect: dict[int, int] = {}  # partition -> delivered count not arrived, last poll
        self._read_to: dict[int, int] = {}  # partition -> delivered count read back to
        self._tasks: list[asyncio.Task[None]] = []
        self._balancing: asyncio.Task[None] | None = None
        self._beating: asyncio.Task[None] | None = None
        self._closing = False
        self.started = False
        self._readiness: Readiness = NOT_STARTED
        self._held_at: float | None = None  # time.monotonic() it last held a partition

    @property
    def ready(self) -> bool:
        """Whether the instance can do its job (:meth:`readiness`)."""
        return self._readiness.ready

    def readiness(self) -> Readiness:
        """The readiness as last assessed (every ``expire_interval_s`` and after each lag poll;
        ``_ready.py``). Safe to call from another thread (the probe server's)."""
        return self._readiness

    def probe(self) -> tuple[bool, str]:
        """``/readyz``: whether ready, and the line it answers with (``probe_app``)."""
        readiness = self._readiness
        return readiness.ready, readiness.body()

    def assess(self) -> Readiness:
        """Assess the readiness now (in the event loop) and export it."""
        readiness = assess(self._facts()) if self.started else NOT_STARTED
        self._readiness = readiness
        self.metrics.ready.set(1 if readiness.ready else 0)
        for reason in REASONS:
            self.metrics.not_ready.labels(reason).set(1 if reason in readiness.reasons else 0)
        return readiness

    def _facts(self) -> Facts:
        s, r, now = self.settings, self.rebalancer, time.monotonic()
        others = [p for name, m in r.members.items() if name != self.member for p in m.pins]
        owned = frozenset(self.partitions.owned())
        if owned:
            self._held_at = now
        polled = self.lag.answered_at
        held_since = self._held_at is not None and (polled is None or self._held_at >= polled)
        return Facts(
            started=self.started,
            connected=self._nc.is_connected,
            store_ok=self.committer.store_ok,
            partitions=s.topology.partitions,
            owned=owned,
            held_since_poll=held_since,
            poll_age_s=self.lag.age_s(),
            lag_poll_s=s.lag_poll_s,
            beat_age_s=_age(now, r.beat_ok_at),
            read_age_s=_age(now, r.read_ok_at),
            member_ttl_s=s.member_ttl_s,
            max_lag_s=s.ready_max_lag_s,
            work=dict(self.lag.work),
            others=frozenset(others),
            waited_s=dict(self.lag.waited_s),
            missing=frozenset(self.lag.missing),
        )

    def leftovers(self) -> str:
        """What stopping now would leave unflushed ("" when nothing): for the stop bound's
        report (``tokenwire.leftovers``). Unacknowledged messages are redelivered."""
        held = [
            counted(n, what)
            for n, what in (
                (self.committer.pending, "closed step not committed"),
                (self.assembly.open_steps, "open step"),
            )
            if n
        ]
        parts = []
        if held:
            parts.append(f"{', '.join(held)} (their messages stay unacknowledged: redelivered)")
        if self._events.pending:
            events = counted(self._events.pending, "persisted event")
            parts.append(
                f"{events} not confirmed by the broker (their steps are stored; the "
                "announcement may be missing)"
            )
        return "; ".join(parts)

    async def start(self) -> Assembler:
        """Start the commit, expiry and lag loops, then the partition consumers."""
        loops: dict[str, Callable[[], Coroutine[Any, Any, None]]] = {
            "commit": self.committer.run,
            "expiry": self._expire_forever,
            "lag": self._poll_lag_forever,
        }
        self._tasks = [asyncio.create_task(loop(), name=name) for name, loop in loops.items()]
        await self.partitions.start(offering=False)
        await self.rebalancer.beat()
        await self.rebalancer.round()
        self._balancing = asyncio.create_task(self._balance_forever(), name="balance")
        self._beating = asyncio.create_task(self._beat_forever(), name="heartbeat")
        await self.poll_lag()
        self.started = True
        self.assess()
        return self

    @property
    def loops(self) -> list[asyncio.Task[None]]:
        """The background loops, which run until :meth:`close`."""
        return [t for t in (*self._tasks, self._balancing, self._beating) if t is not None]

    async def close(self, flush_timeout_s: float = 10.0) -> None:
        """Stop pulling, commit what closed (bounded), hand back what is open, release pins.

        The pins are released last, so no standby takes a partition while this instance
        still commits its steps. Open steps' messages are naked (the next owner gets them at
        once); a commit the store did not take within ``flush_timeout_s`` stays
        unacknowledged (redelivered after ack_wait).
        """
        self._closing = True
        await _cancel([t for t in (self._balancing, self._beating) if t is not None])
        await self.board.leave(self.member)  # the others raise their shares now
        await self.partitions.stop(release=False)
        await _cancel(self._tasks)
        if not await self.committer.flush(flush_timeout_s):
            log.warning(
                "store unavailable at shutdown: %d steps left unacknowledged",
                self.committer.pending,
            )
        await nak_tokens(self.assembly.held_tokens())
        unannounced = await self._events.close(flush_timeout_s)
        if unannounced:
            log.warning("%d persisted events unacknowledged at shutdown", unannounced)
        await self.partitions.unpin()
        self.started = False
        self.assess()

    # -- the handler ---------------------------------------------------------------------

    def _handler_for(self, partition: int) -> BatchHandler:
        async def handle(batch: list[ConsumedMessage]) -> None:
            await self.handle_batch(batch, partition)

        return handle

    async def handle_batch(self, batch: list[ConsumedMessage], partition: int = -1) -> None:
        """Take delivered messages in order; each is settled later (after its step's commit).

        A message whose handling fails unexpectedly is naked for redelivery (the rest of the
        batch goes on); the redelivered copy is deduplicated by its stream sequence.
        """
        async with self._lock(partition):  # a tail read-back (poll_lag) never interleaves
            chunks = await self._handle(batch, partition)
        self.metrics.chunks.inc(chunks)
        self.metrics.open_steps.set(self.assembly.open_steps)

    async def _handle(self, batch: list[ConsumedMessage], partition: int) -> int:
        """Take the batch's messages; how many chunks they carried."""
        chunks = 0
        for i, cm in enumerate(batch):
            if self._closing:  # shutting down: let the next owner have the rest
                await nak_many(batch[i:], 0.5)
                break
            cause = self._missed_before(partition, cm)
            if cause is not None and not await self._take_over(partition, cm, cause):
                await nak_many(batch[i:], self.settings.backoff_max_s)
                self._seen.pop(partition, None)  # the next delivery tries again
                break
            try:
                chunks += await self._take_message(cm, partition)
            except Exception:
                log.exception("assembler failed on seq %s; naking it", cm.stream_seq)
                await nak_many([cm], self.settings.backoff_initial_s)
        return chunks

    def _lock(self, partition: int) -> asyncio.Lock:
        return self._locks.setdefault(partition, asyncio.Lock())

    async def _take_message(self, cm: ConsumedMessage, partition: int) -> int:
        token = Delivery(cm.stream_seq, cm, partition)
        try:
            envelopes = chunk_envelopes(cm.data)
        except msgspec.DecodeError as exc:
            await self._dead_letter([token], "undecodable", str(exc))
            return 0
        envelope = envelopes[0]  # a frame's chunks are one step's
        if envelope.ordinal == 0:
            self.traces.first_chunk((envelope.session, envelope.turn, envelope.step), cm.headers)
        # A step is in the store only if some chunk of it was delivered before. A message
        # delivered for the first time can only belong to one through a duplicate publish
        # under a new Msg-Id, which the idempotent commit absorbs; so only redeliveries pay
        # for the lookup (it queues behind commits on SQLite's single connection).
        repeat = cm.num_delivered > 1 or self.stranded.repeats(partition, cm.stream_seq)
        await self._take(envelopes, token, lookup=repeat)
        return len(envelopes)

    async def _take(self, envelopes: list[ChunkEnvelope], token: Delivery, *, lookup: bool) -> None:
        """One message's chunks (all of one step), fed with the message's token."""
        envelope = envelopes[0]
        key = (envelope.session, envelope.turn, envelope.step)
        if not self.assembly.knows(key):
            if self.committer.attach(key, token):  # its key left the closed memory already
                self.metrics.duplicates.labels("pending").inc()
                return
            # The first chunk here of a step unknown here: a redelivered chunk of a step
            # stored before this process started must not open it again.
            if lookup and await self._stored(key):
                await token.ack()
                return
            await self._wait_for_room(envelope)
        if len(envelopes) > 1:
            await self._take_frame(envelopes, token)
            return
        outcome = self.assembly.feed(envelope, token)
        if outcome is not None:  # most chunks are held in their open step: nothing to await
            await self._on_outcome(outcome)

    async def _take_frame(self, envelopes: list[ChunkEnvelope], token: Delivery) -> None:
        """A frame's chunks under one token: the message is settled with its step when any
        chunk of it was taken into the step (held, or closing it); a chunk the step cannot
        take (past its finish, a bad ordinal) is copied to the DLQ beside it, and the whole
        message is dead-lettered only when no chunk of it was taken."""
        fed = self.assembly.feed_frame(envelopes, token)
        taken = fed.taken
        settled: Settled[Delivery] | None = None
        poisoned: list[Poisoned[Delivery]] = []
        for outcome in fed.outcomes:
            match outcome:
                case ClosedStep():
                    self.committer.add(outcome)
                case Settled():
                    settled = outcome
                case Poisoned():
                    poisoned.append(outcome)
                case _:
                    assert_never(outcome)
        if poisoned:
            kept = taken or settled is not None
            first = poisoned[0]
            await self._dead_letter([token], first.reason, first.detail, terminate=not kept)
        if settled is not None and not taken:
            await self._on_outcome(settled)

    async def _on_outcome(self, outcome: Outcome[Delivery]) -> None:
        match outcome:
            case ClosedStep():
                self.committer.add(outcome)
            case Settled(token=token, key=key, late=late):
                self.metrics.duplicates.labels("late" if late else "closed").inc()
                if not self.committer.attach(key, token):
                    await token.ack()
            case Poisoned(token=token, reason=reason, detail=detail):
                await self._dead_letter([token], reason, detail)
            case _:
                assert_never(outcome)

    async def _stored(self, key: StepKey) -> bool:
        """Whether the store has the step (then its chunks are acknowledged as duplicates)."""
        event = await self._retry_store(lambda: self._store.step_outcome(*key))
        if event is None:
            return False
        self.assembly.remember_closed(key)
        self.metrics.duplicates.labels("store").inc()
        await self._publish_persisted(_persisted_from_event(event))
        return True

    async def _retry_store(
        self, call: Callable[[], Awaitable[MessageEvent | ErrorEvent | None]]
    ) -> MessageEvent | ErrorEvent | None:
        delay = self.settings.backoff_initial_s
        while True:
            try:
                result = await call()
            except (StoreUnavailable, StoreConfigError) as exc:
                # Waited for as the Committer waits: naked instead, the message spent one of
                # its max_deliver deliveries per back-off, then was never delivered again.
                label = "unavailable" if isinstance(exc, StoreUnavailable) else "config"
                self.metrics.store_failures.labels(label).inc()
                self.committer.set_store_ok(False)
                log.warning("store lookup failed: %s", exc)
            else:
                return result
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.settings.backoff_max_s)

    async def _wait_for_room(self, envelope: ChunkEnvelope) -> None:
        """Back-pressure: hold this message (and so this partition) until a step closes."""
        while self.committer.full or not self.assembly.has_room(envelope):
            if self.committer.full:
                await self.committer.wait_for_room()
            else:
                await asyncio.sleep(min(0.1, self.settings.expire_interval_s))

    # -- taking over a partition -----------------------------------------------------------

    def _missed_before(self, partition: int, cm: ConsumedMessage) -> ReadBackCause | None:
        """Whether messages before ``cm`` may have been delivered that this instance never
        handled: the partition is newly pinned here (a previous owner may hold some), or the
        consumer sequence jumped under our pin (a pinned client receives every delivery, so
        the ones in between were lost on the way, e.g. from a broker node that died)."""
        if cm.pin_id is None:
            return None
        seen = self._seen.get(partition)
        self._seen[partition] = (cm.pin_id, cm.consumer_seq)
        if seen is None or seen[0] != cm.pin_id:
            return "pin"
        return "lost" if cm.consumer_seq > seen[1] + 1 else None

    async def _take_over(
        self, partition: int, first: ConsumedMessage, cause: ReadBackCause
    ) -> bool:
        """Before ``first``: read back what another owner, or the way here, may hold. False
        when every attempt failed (bounded: READ_BACK_ATTEMPTS, with back-off)."""
        return await self._bounded(
            partition, cause, lambda: self._read_back_before(partition, first)
        )

    async def _bounded(
        self, partition: int, cause: ReadBackCause, attempt: Callable[[], Awaitable[None]]
    ) -> bool:
        delay = self.settings.backoff_initial_s
        for n in range(1, READ_BACK_ATTEMPTS + 1):
            try:
                await attempt()
            except ReadBackError as exc:
                log.warning(
                    "partition %d: read-back %d of %d failed: %s",
                    partition,
                    n,
                    READ_BACK_ATTEMPTS,
                    exc,
                )
            else:
                self.metrics.read_backs.labels(cause, "ok").inc()
                return True
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.settings.backoff_max_s)
        self.metrics.read_backs.labels(cause, "failed").inc()
        return False

    async def _read_back_before(self, partition: int, first: ConsumedMessage) -> None:
        state = await partition_state(self._nc, self.settings.topology, partition)
        if state is None:
            raise ReadBackError("the consumer's info went unanswered")
        if state.num_ack_pending == 0:
            return  # nothing delivered is unsettled: no one holds anything
        if first.num_delivered == 1 and first.consumer_seq == state.ack_floor.consumer_seq + 1:
            return  # a fresh delivery right above the ack floor: nothing before it is held
        # Read back even when every unacked message is on its way to us: redeliveries come
        # in the order the server queued them (our predecessor's naks, then its expired
        # deliveries, as each happened), not in stream order, so a session's later step could
        # complete here before the earlier one. The copies are fed in stream order.
        # The server hands out fresh messages in stream order, so when our first message is a
        # fresh one, everything the previous owner could hold lies below it; when it is a
        # redelivery, read up to the last message delivered to anyone (the previous owner's
        # unacknowledged messages come back only after ack_wait, interleaved with new ones).
        # The read must get to ``first`` itself: a replica still catching up ends it early.
        first_seq = first.stream_seq
        fresh = first.num_delivered == 1
        last = first_seq - 1 if fresh else max(first_seq - 1, state.delivered.stream_seq)
        await self._feed_range(partition, state.ack_floor.stream_seq + 1, last, first_seq)

    async def _feed_range(self, partition: int, start: int, last: int, reach: int) -> None:
        """Feed copies of the partition's messages ``start..last`` read from the stream; the
        read must get to ``reach`` (a stored message of the partition: see read_back)."""
        if start > last:
            return
        log.info("partition %d: reading back seqs %d..%d", partition, start, last)
        t = self.settings.topology
        async for seq, data in read_back(self._nc, t, partition, start, last, reach):
            try:
                envelopes = chunk_envelopes(data)
            except msgspec.DecodeError:
                continue  # its redelivery is dead-lettered
            await self._take(envelopes, Delivery(-seq, None, partition), lookup=True)

    async def _check_tail(self, partition: int, state: ConsumerState) -> None:
        """Deliveries the server made under our pin after the last one that arrived, with
        no later delivery to reveal the jump (the last chunks before a broker node died).
        Seen on two polls in a row (what was on the way had a poll period to arrive), and
        the server still pinning us, they are read back from the ack floor to the last
        delivered message; once per count (a read-back that failed counts for nothing)."""
        consumer = self.partitions.consumers.get(partition)
        last = consumer.last_delivery if consumer is not None else None
        sent = state.delivered.consumer_seq
        if (
            consumer is None
            or last is None
            or last.pin_id is None
            or last.pin_id != consumer.pin_id
            or state.pinned(self.settings.topology.assembler_group) != last.pin_id
            or sent <= max(last.consumer_seq, self._read_to.get(partition, 0))
            or consumer.waiting
            or self._lock(partition).locked()
        ):
            self._suspect.pop(partition, None)
            return
        if self._suspect.pop(partition, None) != sent:
            self._suspect[partition] = sent
            return
        start, end = state.ack_floor.stream_seq + 1, state.delivered.stream_seq
        reach = last.stream_seq  # at least as far as what did arrive (see read_back)
        async with self._lock(partition):
            read = await self._bounded(
                partition, "tail", lambda: self._feed_range(partition, start, end, reach)
            )
        if read:  # a failed one is tried again after two more polls
            self._read_to[partition] = sent

    async def _check_stranded(self, partition: int, state: ConsumerState) -> None:
        """A partition allotted here whose deliveries a holder gone held: delivered again now
        (``_stranded.py``), not after ``ack_wait``."""
        consumer = self.partitions.consumers.get(partition)
        standing_by = (
            consumer is not None
            and consumer.offering
            and not consumer.pinned
            and partition in self.rebalancer.standby
        )
        if await self.stranded.check(partition, state, standing_by=standing_by):
            self._read_to.pop(partition, None)  # consumer sequences restart at 1

    # -- handing a partition over (elastic shares, ADR 0016) --------------------------------

    def _in_flight(self, partition: int) -> int:
        """Messages of ``partition`` held here unacknowledged (open, waiting for a commit,
        delivered but not handled yet)."""
        tokens = [*self.assembly.held_tokens(), *self.committer.held_tokens()]
        held = sum(1 for t in tokens if t.partition == partition and t.message is not None)
        consumer = self.partitions.consumers.get(partition)
        return held + (consumer.buffered if consumer is not None else 0)

    async def hand_over(self, partition: int) -> None:
        """Give ``partition`` to a standby: stop its pulls, let its closed steps commit
        (bounded by ``handover_wait_s``), release the pin, hand back its open steps.

        The pin is still ours while we wait (we stopped renewing it, so the server would
        move it itself after the priority timeout, which the wait stays below). Open steps
        are not closed here: their messages are naked, the next owner reads the partition
        back from the ack floor and assembles them whole.
        """
        consumer = self.partitions.consumers[partition]
        started = time.monotonic()
        wait_s = min(self.settings.handover_wait_s, self.settings.priority_timeout_s / 2)
        if not await consumer.pause(wait_s):
            log.warning("partition %d: its handler is busy; hand-over postponed", partition)
            consumer.resume()
            return
        try:
            await self._release(partition, started + wait_s - time.monotonic())
        finally:
            consumer.offering = False
            consumer.resume()
        self.metrics.handovers.inc()
        self.metrics.handover_seconds.observe(time.monotonic() - started)

    async def _release(self, partition: int, wait_s: float) -> None:
        consumer = self.partitions.consumers[partition]
        if not await self.committer.settle(partition, wait_s):
            log.warning("partition %d: handing over before its commits finished", partition)
        released = await consumer.release()
        n = self.settings.topology.partitions
        open_tokens = self.assembly.drop_open(lambda s: partition_of(s, n) == partition)
        await nak_tokens(open_tokens)
        for memo in (self._seen, self._suspect, self._read_to):
            memo.pop(partition, None)
        log.info(
            "partition %d handed over (pin %s, %d open-step messages handed back)",
            partition,
            released,
            len(open_tokens),
        )

    async def _beat_forever(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.settings.heartbeat_s)
            try:
                await self.rebalancer.beat()
            except Exception:
                log.exception("heartbeat failed")

    async def _balance_forever(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.settings.heartbeat_s)
            try:
                await self.rebalancer.round()
            except Exception:  # a round is retried next period; a dead loop would stop beats
                log.exception("membership round failed")

    # -- effects ---------------------------------------------------------------------------

    async def _dead_letter(
        self, tokens: Sequence[Delivery], reason: str, detail: str, *, terminate: bool = True
    ) -> None:
        """Copy each message to the DLQ subject (acked by the DLQ stream), then terminate it
        (unless ``terminate`` is false: a frame settled with its step).

        If the DLQ publish fails the message is left unacknowledged: it comes back after
        ack_wait and is dead-lettered then (the Msg-Id makes the copy unique).
        """
        t = self.settings.topology
        for token in tokens:
            cm = token.message
            if cm is None:
                continue  # a read-back copy: its redelivery is dead-lettered
            stream = _stream_of_message(t, cm.subject)
            copied = await dead_letter(
                self._nc,
                self._dlq_subject,
                cm,
                stream=stream,
                reason=reason,
                detail=detail,
                terminate=terminate,
            )
            if copied:
                self.metrics.dead_lettered.labels(reason).inc()

    async def _announce(self, result: CommittedStep) -> None:
        key = (result.session, result.turn, result.step)
        self.traces.committed(key, result.outcome_kind, result.seq_start, result.seq_end)
        await self._publish_persisted(
            StepPersisted(
                session=result.session,
                turn=result.turn,
                step=result.step,
                outcome=result.outcome_kind,
                seq_start=result.seq_start,
                seq_end=result.seq_end,
            )
        )

    async def _publish_persisted(self, event: StepPersisted) -> None:
        """Into the session's events stream, at least once (:class:`EventPublisher`: waits
        only when 10,000 are in flight); the Msg-Id stores a re-announcement once."""
        subject = self.settings.topology.event_subject(event.session, "persisted")
        msg_id = f"persisted:{event.session}:{event.turn}:{event.step}"
        await self._events.publish(subject, json_encoder.encode(event), msg_id)

    # -- loops -----------------------------------------------------------------------------

    async def _expire_forever(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.settings.expire_interval_s)
            try:
                await self.expire()
            except Exception:  # a pass is tried again next period; a dead loop closes nothing
                log.exception("expiry pass failed")
            self.metrics.open_steps.set(self.assembly.open_steps)
            self.assess()

    async def expire(self) -> None:
        """One expiry pass: close the due steps the broker shows cannot finish, hand back
        those of partitions held elsewhere now, let the others wait (``_expiry.py``)."""
        expired = await self.expiry.run(self._clock())
        for closed in expired.closed:
            self.committer.add(closed)
        if expired.handed_back:
            log.info(
                "handing back %d messages of due steps on partitions held elsewhere",
                len(expired.handed_back),
            )
            await nak_tokens(expired.handed_back)
        self.metrics.expiry.labels("closed").inc(len(expired.closed))
        self.metrics.expiry.labels("handed-back").inc(len(expired.handed_back))
        self.metrics.expiry.labels("waiting").inc(expired.waiting)

    async def _partition_view(self, partition: int) -> PartitionView | Unanswered:
        consumer = self.partitions.consumers.get(partition)
        held = self._in_flight(partition) - (consumer.buffered if consumer is not None else 0)
        return await partition_view(self._nc, self.settings.topology, partition, consumer, held)

    async def _poll_lag_forever(self) -> None:
        while not self._closing:
            await asyncio.sleep(self.settings.lag_poll_s)
            await self.poll_lag()

    async def poll_lag(self) -> tuple[int, int] | None:
        """Update the lag gauges and what the readiness knows (``_lag.py``);
        ``(num_pending, num_ack_pending)`` summed over partitions (None when a partition did
        not answer)."""
        states = await self.lag.poll()
        self.metrics.owned_partitions.set(len(self.partitions.owned()))
        for p, state in enumerate(states):
            if state is not None:
                await self._check_tail(p, state)
                await self._check_stranded(p, state)
        if self.started:
            self.assess()
        if any(state is None for state in states):
            return None
        return (
            sum(s.num_pending for s in states if s is not None),
            sum(s.num_ack_pending for s in states if s is not None),
        )

    async def drained(self) -> bool:
        """Everything the stream holds was delivered and settled, except the messages of
        steps still open here (incomplete streams), and nothing waits for a commit."""
        if self.partitions.buffered() or self.committer.pending:
            return False
        totals = await self.poll_lag()
        if totals is None or self.partitions.buffered() or self.committer.pending:
            return False
        held = sum(1 for token in self.assembly.held_tokens() if token.message is not None)
        return totals == (0, held)


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel and await the loops. Python 3.11's wait_for (inside nats-py's request) can
    swallow a cancellation that races a reply, so cancel again until each task ended."""
    while pending := [t for t in tasks if not t.done()]:
        for task in pending:
            task.cancel()
        await asyncio.wait(pending, timeout=1.0)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            log.error("assembler loop %s failed", task.get_name(), exc_info=task.exception())


def _age(now: float, then: float | None) -> float | None:
    return None if then is None else now - then


def _policy(s: AssemblerSettings) -> CommitPolicy:
    return CommitPolicy(
        batch_max_steps=s.batch_max_steps,
        batch_max_s=s.batch_max_s,
        max_pending_steps=s.max_pending_steps,
        backoff_initial_s=s.backoff_initial_s,
        backoff_max_s=s.backoff_max_s,
    )


def _persisted_from_event(event: MessageEvent | ErrorEvent) -> StepPersisted:
    return StepPersisted(
        session=event.session,
        turn=event.turn,
        step=event.step,
        outcome="message" if isinstance(event, MessageEvent) else "error",
        seq_start=event.seq_start,
        seq_end=event.seq_end,
    )


def _stream_of_message(t: Topology, subject: str) -> str:
    """The shard stream a consumed chunk came from (its partition's), for the DLQ record;
    the layout's first stream for a subject that is not a chunk subject."""
    try:
        return t.stream_of_partition(parse_stored_subject(t, subject)[0])
    except ValueError:
        return t.chunk_streams[0]
