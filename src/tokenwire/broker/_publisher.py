"""``ChunkPublisher``: the gateway's pipelined, deduplicated, bounded JetStream publisher.

Core NATS publishes with a reply subject each under one wildcard inbox subscription, the acks
counted in a callback (awaiting each ack would cost a round trip per chunk, and
``publish_async`` futures whose ack is an error never resolve). Bounded: at most ``window``
messages in flight (``publish`` waits for a slot); a message without a positive ack after
``ack_timeout_s`` is resent with the same ``Nats-Msg-Id`` until ``retry_horizon_s``, then its
step fails with :class:`PublishTimeout`; a permanent error ack fails it at once
(:class:`PublishRejected`); a message over the server's ``max_payload`` raises
:class:`PayloadTooLarge` before it is sent. Messages go out in call order; readers restore
order by ordinal. docs/broker.md, "Publisher semantics"; the figures: docs/benchmarks.md,
"Figures behind the code's choices".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
from nats.aio.client import Client
from nats.errors import ConnectionClosedError
from nats.errors import Error as NatsError

from tokenwire.broker._api import server_url
from tokenwire.broker._errors import (
    BrokerError,
    BrokerUnavailable,
    FlushTimeout,
    PayloadTooLarge,
    PublishRejected,
    PublishTimeout,
)
from tokenwire.broker._frames import FrameWriter, header_block
from tokenwire.broker._puback import puback_decoder
from tokenwire.broker._replies import ReplyInbox
from tokenwire.broker._topology import Topology, chunk_subject, msg_id

StepKey = tuple[str, int, int]
log = logging.getLogger(__name__)

_RETRYABLE_CODES = frozenset({408, 503})
_MAX_REMEMBERED_FAILURES = 10_000


@dataclass(frozen=True, slots=True)
class PublisherStats:
    """Counters for Prometheus: totals since start, and the current in-flight gauge."""

    published: int
    acked: int
    duplicates: int
    retried: int
    failed: int
    in_flight: int


@dataclass(slots=True)
class _Pending:
    subject: str
    payload: bytes
    headers: dict[str, str]
    header: bytes  # header_block(headers): built once, for the size check and every frame
    msg_id: str
    step: StepKey
    first_sent: float
    due: float
    attempts: int = 0


class _Window:
    """At most ``size`` slots taken; waiters served first come, first served, O(1) each.

    Not ``asyncio.Semaphore``: in Python 3.11 its ``locked()`` is true while any woken waiter
    has not resumed yet, so once the window filled up every later ``publish`` queued behind
    the waiters and suspended (a task and a loop turn per chunk) even with the window nearly
    empty, a convoy that never drained under steady load (bench/bench_gateway.py). Here a
    release hands its slot directly to the oldest waiter, so a free slot always means nobody
    waits and :meth:`try_take` is a counter decrement.
    """

    __slots__ = ("_free", "_waiters")

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiters: deque[asyncio.Future[None]] = deque()

    def try_take(self) -> bool:
        """Take a slot if one is free, without waiting."""
        if self._free > 0:
            self._free -= 1
            return True
        return False

    async def take(self, timeout_s: float) -> None:
        """Wait (FIFO) for a slot; ``TimeoutError`` after ``timeout_s``."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(timeout_s):
                await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot reached us as we gave up: pass it on
            waiter.cancel()  # still queued: release() skips cancelled waiters
            raise

    def release(self) -> None:
        """Give a slot back: to the oldest live waiter, else to the free count."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


@dataclass(slots=True)
class _StepState:
    outstanding: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)


class ChunkPublisher:
    """Publishes chunk envelopes to ``<prefix>.in.<session>.first|next`` with a Msg-Id each.

    Use::

        publisher = await ChunkPublisher(nc, topology).start()
        await publisher.publish(envelope_bytes, session, turn, step, ordinal, first=ordinal == 0)
        await publisher.wait_acked(session, turn, step)   # the step is durable (or raises)
        await publisher.close()
    """

    def __init__(
        self,
        nc: Client,
        topology: Topology,
        *,
        window: int = 1024,
        ack_timeout_s: float = 2.0,
        retry_horizon_s: float = 30.0,
        tick_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nc = nc
        self._topology = topology
        self._window = _Window(window)
        self._ack_timeout = ack_timeout_s
        self._horizon = retry_horizon_s
        self._tick = tick_s
        self._clock = clock
        self._prefix = ""
        self._serial = 0
        self._pending: dict[str, _Pending] = {}
        self._steps: dict[StepKey, _StepState] = {}
        self._failed: OrderedDict[StepKey, BrokerError] = OrderedDict()
        self._idle = asyncio.Event()
        self._idle.set()
        # No pending message is due (resend) or expired (horizon) before this; the reaper
        # scans the pending messages only from then on, not every tick (a scan of a full
        # window every 50 ms cost ~2-5% of the gateway's CPU).
        self._next_due = math.inf
        self._inbox = ReplyInbox(nc, self._on_ack)
        self._frames = FrameWriter(nc)
        self._reaper: asyncio.Task[None] | None = None
        self._published = self._acked = self._duplicates = self._retried = self._failures = 0

    async def start(self) -> ChunkPublisher:
        """Subscribe the ack inbox and start the retry loop; returns self."""
        self._prefix = (await self._inbox.start()).prefix
        self._reaper = asyncio.create_task(self._reap_forever(), name="publisher-reaper")
        return self

    async def close(self, timeout_s: float = 5.0) -> None:
        """Wait (bounded) for in-flight acks, then stop; whatever is left fails its step."""
        with contextlib.suppress(FlushTimeout):
            await self.flush(timeout_s)
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        if self._pending:
            log.warning(
                "%d chunk messages not acknowledged at close: their steps fail", len(self._pending)
            )
        for token in list(self._pending):
            entry = self._pending[token]
            self._fail(token, PublishTimeout(entry.subject, entry.msg_id, timeout_s))
        await self._inbox.close()

    async def publish(
        self,
        envelope_bytes: bytes,
        session: str,
        turn: int,
        step: int,
        ordinal: int,
        *,
        first: bool,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Send one chunk message (a v1 envelope, or a v2 frame of several consecutive chunks
        of the step, ``ordinal`` being its first); returns once it is on the wire, not once
        it is acked. Its ``Nats-Msg-Id`` is ``<session>:<turn>:<step>:<ordinal>``, the same
        on every resend.

        Raises PayloadTooLarge (nothing sent, the step unharmed) when the payload and its
        headers exceed the server's ``max_payload``. Waits for a window slot when ``window``
        messages are in flight; raises PublishTimeout if none frees up within the retry
        horizon, BrokerUnavailable if the connection is closed. Acks are tracked per
        (session, turn, step): see :meth:`wait_acked`.
        """
        subject = chunk_subject(self._topology, session, first)
        mid = msg_id(session, turn, step, ordinal)
        all_headers = {**(headers or {}), "Nats-Msg-Id": mid}
        header = header_block(all_headers)
        self._check_size(subject, len(header), len(envelope_bytes))
        await self._acquire_slot(subject, mid)
        now = self._clock()
        entry = _Pending(
            subject,
            envelope_bytes,
            all_headers,
            header,
            mid,
            (session, turn, step),
            now,
            now + self._ack_timeout,
        )
        self._serial += 1
        token = str(self._serial)
        self._pending[token] = entry
        self._due_by(entry)
        self._idle.clear()
        self._step_state(entry.step).outstanding += 1
        self._published += 1
        await self._send(token, entry)

    def _check_size(self, subject: str, head: int, payload_size: int) -> None:
        limit = self._nc.max_payload
        if head + payload_size > limit:
            raise PayloadTooLarge(subject, head + payload_size, limit, max(limit - head, 0))

    async def _acquire_slot(self, subject: str, mid: str) -> None:
        if self._window.try_take():
            return
        started = self._clock()
        try:
            await self._window.take(self._resolution_bound())
        except TimeoutError:
            raise PublishTimeout(subject, mid, self._clock() - started) from None

    def _step_state(self, key: StepKey) -> _StepState:
        state = self._steps.get(key)
        if state is None:
            state = self._steps[key] = _StepState()
        return state

    async def _send(self, token: str, entry: _Pending) -> None:
        reply = self._prefix + token
        if not self._nc.is_connected and not self._nc.is_closed:
            # Reconnecting: not into nats-py's reconnect buffer, which is flushed when the
            # broker is back, also after the horizon failed the step and its caller was told
            # so (the step would be stored whole). The reaper resends it when due, within
            # the horizon; a closed connection still raises below.
            entry.due = self._clock() + self._backoff(entry.attempts)
            self._due_by(entry)
            return
        try:
            if self._frames.usable(len(entry.payload)):
                await self._frames.publish(entry.subject, reply, entry.header, entry.payload)
            else:  # draining, oversized: nats-py's own errors
                await self._nc.publish(
                    entry.subject, entry.payload, reply=reply, headers=entry.headers
                )
        except ConnectionClosedError as exc:
            self._fail(token, BrokerUnavailable(server_url(self._nc), "connection closed"))
            raise BrokerUnavailable(server_url(self._nc), "connection closed") from exc
        except NatsError:
            # Disconnected meanwhile (or draining): the reaper resends when due.
            entry.due = self._clock() + self._backoff(entry.attempts)
            self._due_by(entry)

    def _due_by(self, entry: _Pending) -> None:
        """Keep ``_next_due`` at or before the entry's next resend or expiry."""
        self._next_due = min(self._next_due, entry.due, entry.first_sent + self._horizon)

    def _on_ack(self, token: str, data: bytes, status: int | None) -> None:
        entry = self._pending.get(token)
        if entry is None:
            return  # a late ack of a message already resolved
        if status is not None:
            self._retry_later(entry, status)
            return
        try:
            ack = puback_decoder.decode(data)
        except msgspec.DecodeError:
            self._retry_later(entry, 503)  # not an ack: resent with its id, deduplicated
            return
        if ack.error is None:
            self._resolve(token, ack.duplicate)
        elif ack.error.code in _RETRYABLE_CODES:
            self._retry_later(entry, ack.error.code)
        else:
            err = PublishRejected(
                entry.subject, entry.msg_id, ack.error.code, ack.error.description
            )
            self._fail(token, err)

    def _retry_later(self, entry: _Pending, code: int) -> None:
        entry.due = self._clock() + self._backoff(entry.attempts)
        self._due_by(entry)

    def _backoff(self, attempts: int) -> float:
        return float(min(0.05 * 2**attempts, 2.0))

    def _resolve(self, token: str, duplicate: bool) -> None:
        entry = self._pending.pop(token)
        self._acked += 1
        self._duplicates += duplicate
        self._finish(entry)

    def _fail(self, token: str, error: BrokerError) -> None:
        entry = self._pending.pop(token, None)
        if entry is None:
            return
        self._failures += 1
        if entry.step not in self._failed:
            self._failed[entry.step] = error
            while len(self._failed) > _MAX_REMEMBERED_FAILURES:
                self._failed.popitem(last=False)
        self._finish(entry)

    def _finish(self, entry: _Pending) -> None:
        self._window.release()
        state = self._steps[entry.step]
        state.outstanding -= 1
        if state.outstanding == 0:
            state.done.set()
            del self._steps[entry.step]
        if not self._pending:
            self._idle.set()

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self._tick)
            now = self._clock()
            if self._pending and now >= self._next_due:
                await self._reap(now)

    async def _reap(self, now: float) -> None:
        """Resend (in publish order) what is due; fail what outlived the horizon."""
        self._next_due = math.inf  # lowered again by every entry that stays pending
        for token, entry in list(self._pending.items()):
            if token not in self._pending:
                continue  # resolved while an earlier resend was being written
            waited = now - entry.first_sent
            if waited >= self._horizon:
                self._fail(token, PublishTimeout(entry.subject, entry.msg_id, waited))
                continue
            if entry.due > now:
                self._due_by(entry)
                continue
            entry.attempts += 1
            entry.due = now + self._ack_timeout
            self._due_by(entry)
            self._retried += 1
            with contextlib.suppress(BrokerUnavailable):
                await self._send(token, entry)

    async def wait_acked(
        self, session: str, turn: int, step: int, timeout_s: float | None = None
    ) -> None:
        """Return once every chunk published so far for the step is acked.

        Raises the step's first error (PublishTimeout, PublishRejected, BrokerUnavailable) if
        any of its chunks failed. The wait is bounded by ``timeout_s`` (default: the retry
        horizon plus a margin, by which every chunk has resolved); FlushTimeout past it.
        """
        key = (session, turn, step)
        state = self._steps.get(key)
        if state is not None:
            bound = timeout_s if timeout_s is not None else self._resolution_bound()
            try:
                async with asyncio.timeout(bound):  # no task per wait, unlike wait_for
                    await state.done.wait()
            except TimeoutError:
                raise FlushTimeout(state.outstanding, bound) from None
        error = self._failed.get(key)
        if error is not None:
            raise error

    def _resolution_bound(self) -> float:
        """How long after its first send a message is sure to be acked or failed."""
        return self._horizon + 2 * self._tick + 1.0

    async def flush(self, timeout_s: float = 35.0) -> None:
        """Wait until every in-flight message is resolved (acked or failed); FlushTimeout past."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            raise FlushTimeout(len(self._pending), timeout_s) from None

    def step_error(self, session: str, turn: int, step: int) -> BrokerError | None:
        """The first error of a step, if one of its chunks failed (the last 10,000 failed steps)."""
        return self._failed.get((session, turn, step))

    @property
    def max_payload(self) -> int:
        """The connected server's ``max_payload`` (payload and header block together)."""
        return int(self._nc.max_payload)

    def oldest_unacked_s(self) -> float:
        """How long the oldest message in flight has waited for its ack since its first send
        (0 when none is in flight): past a few resends, the broker is not taking chunks."""
        for entry in self._pending.values():  # kept in first-send order
            return max(0.0, self._clock() - entry.first_sent)
        return 0.0

    def stats(self) -> PublisherStats:
        """Counters since start plus the in-flight gauge."""
        return PublisherStats(
            self._published,
            self._acked,
            self._duplicates,
            self._retried,
            self._failures,
            len(self._pending),
        )
