"""Callback-driven pull consumers, with JetStream priority groups (``pinned_client``).

nats-py's ``fetch()`` is slow and has no priority groups, so this is the narrow fast path:
one wildcard inbox subscription per consumer, each pull (``$JS.API.CONSUMER.MSG.NEXT``) on
its own reply subject under it, deliveries and status messages accounted per pull, like
nats.go's ``Consume()``. Requested-but-unhandled messages never exceed ``batch``; one worker
per consumer calls the handler in delivery order (or, ``concurrent``, side by side); messages
are settled by the handler's outcome or, with ``auto_ack=False``, by their owner
(:func:`ack_many`). Pinning, renewal, hand-over and declined pins: docs/broker.md,
"Consumers and partition ownership"; ADR 0002, 0016 and 0026.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from tokenwire.broker._api import NS, api_request, cancel_task
from tokenwire.broker._consumed import ACK, ConsumedMessage, nak_payload
from tokenwire.broker._deadletter import dead_letter, seq_of
from tokenwire.broker._errors import BrokerError
from tokenwire.broker._frames import FrameWriter, pub_frame
from tokenwire.broker._replies import header_value, status_of, tap, untap
from tokenwire.broker._translate import translated

log = logging.getLogger(__name__)

PIN_HEADER = "Nats-Pin-Id"
_PIN_FIELD = PIN_HEADER.encode()
_END_OF_PULL = frozenset({404, 408, 409})
_PIN_MOVED = 423


class Retry(Exception):  # noqa: N818 - a control-flow signal, named like arq's Retry
    """Raised by a handler: redeliver this message after ``delay_s`` (nak with delay)."""

    def __init__(self, delay_s: float = 1.0) -> None:
        self.delay_s = delay_s
        super().__init__(f"retry in {delay_s} s")


class Reject(Exception):  # noqa: N818 - a control-flow signal
    """Raised by a handler: this message can never succeed; terminate and dead-letter it."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


async def unpin(nc: Client, stream: str, consumer: str, group: str, timeout_s: float = 2.0) -> None:
    """Release ``group``'s pin on ``consumer`` now (``$JS.API.CONSUMER.UNPIN``), so a standby
    takes over at once instead of after the priority timeout."""
    subject = f"$JS.API.CONSUMER.UNPIN.{stream}.{consumer}"
    with translated(nc, subject):
        await api_request(nc, subject, {"group": group}, timeout_s=timeout_s)


async def reset(nc: Client, stream: str, consumer: str, timeout_s: float = 2.0) -> int:
    """Deliver again, now, everything above ``consumer``'s ack floor
    (``$JS.API.CONSUMER.RESET`` with no body, nats-server 2.14+, ADR-60 of nats.io): the
    server forgets its pending deliveries, their delivery counts and the pin, keeps the ack
    floor, and delivers from above it in stream order, messages acknowledged above the floor
    included (consumer sequences restart at 1). Returns the stream sequence it delivers next.
    A server before 2.14 does not answer: ``RequestFailed`` after ``timeout_s``."""
    subject = f"$JS.API.CONSUMER.RESET.{stream}.{consumer}"
    with translated(nc, subject):
        reply = await api_request(nc, subject, timeout_s=timeout_s)
    return int(reply.get("reset_seq", 0))


async def ack_many(messages: Iterable[ConsumedMessage]) -> int:
    """Acknowledge every message not settled yet, without a round trip per message.

    Each ``+ACK`` goes into the connection's outgoing buffer; nats-py's flusher writes them
    out together. Returns how many could not be sent (the connection is closed): those are
    redelivered after ``ack_wait``, which is the safe outcome for at-least-once work.
    """
    return await _settle_many(messages, ACK)


async def nak_many(messages: Iterable[ConsumedMessage], delay_s: float | None = None) -> int:
    """Hand back every message not settled yet (redelivered after ``delay_s``); see ack_many."""
    return await _settle_many(messages, nak_payload(delay_s))


async def _settle_many(messages: Iterable[ConsumedMessage], payload: bytes) -> int:
    pending = [cm for cm in messages if not cm._settled]
    if pending and await _settle_as_frames(pending, payload):
        return 0
    failed = 0
    for cm in pending:
        try:
            await cm._nc.publish(cm._reply, payload)
        except NatsError:
            failed += 1
        else:
            cm._settled = True
    if failed:
        log.warning("could not settle %d messages; they are redelivered after ack_wait", failed)
    return failed


async def _settle_as_frames(pending: list[ConsumedMessage], payload: bytes) -> bool:
    """Settle ``pending`` (all on one connection that is up) as frames appended at once;
    False, with nothing sent, when the public path must be taken."""
    nc = pending[0]._nc
    writer = FrameWriter(nc)
    if not writer.usable(len(payload)) or any(cm._nc is not nc for cm in pending):
        return False
    frames = b"".join([pub_frame(cm._reply, payload) for cm in pending])
    await writer.write(frames, len(pending), len(payload) * len(pending))
    for cm in pending:
        cm._settled = True
    return True


Handler = Callable[[ConsumedMessage], Awaitable[None]]
"""One message at a time. Return -> ack (unless ``PullSettings.auto_ack`` is False); raise
Retry -> nak with delay; raise Reject -> term + dead-letter; any other exception -> nak with
backoff, dead-lettered on the last allowed delivery."""

BatchHandler = Callable[[list[ConsumedMessage]], Awaitable[None]]
"""Every message delivered since the last call, in delivery order (at most
``PullSettings.batch``). The outcome applies to each message of the batch the handler did
not settle itself: return -> ack (unless ``auto_ack`` is False); raise Retry -> nak them with
delay; raise Reject -> dead-letter and term them; any other exception -> nak them with backoff
(those on their last allowed delivery are dead-lettered). A handler that wants a different
outcome per message settles those messages itself before returning or raising."""


@dataclass(slots=True)
class _Pull:
    remaining: int
    deadline: float


@dataclass(frozen=True, slots=True)
class PullSettings:
    """Sizing and ack mode of the pull loop.

    - ``batch`` bounds requested-but-unhandled messages (and so a batch handler's batch).
    - ``auto_ack``: True acks each message its handler returned for. False is manual ack:
      the consumer never acks; the handler (or whoever it hands the message to) settles it
      later with the message's verbs or :func:`ack_many`. Exceptions are handled the same in
      both modes (Retry, Reject, other), for the messages not settled yet.
    - ``concurrent``: a per-message ``handler`` is called for every message delivered since its
      last calls at once (at most ``batch``), their order not kept; each settled by its own
      outcome. Ignored with a ``batch_handler``.
    - ``pin_keepalive_s``: a pinned client that sent no pull for this long sends a
      one-message pull anyway (at most ``batch`` beyond the bound), whether it is busy in a
      handler call or merely waiting on open pulls: the server unpins a client that sends no
      new pull request for ``priority_timeout``, and a live owner must not hand the partition
      to a standby while it still holds messages. Keep it below half the priority timeout.
    """

    batch: int = 256
    expires_s: float = 5.0
    standby_expires_s: float = 2.0
    max_deliver: int = 10
    retry_backoff_s: float = 1.0
    auto_ack: bool = True
    pin_keepalive_s: float = 1.0
    concurrent: bool = False


@dataclass
class ConsumerStats:
    """Counters of one consumer (delivered, handled, retried, rejected, pulls sent)."""

    delivered: int = 0
    handled: int = 0
    retried: int = 0
    rejected: int = 0
    pulls: int = 0
    pin_changes: int = 0
    batches: int = 0
    declined: int = 0


@dataclass
class PullConsumer:
    """A durable pull consumer driven by a callback loop; ``group`` enables pinned_client.

    Give exactly one of ``handler`` (one message per call) or ``batch_handler`` (every
    message delivered since the last call; no per-message call overhead)::

        consumer = PullConsumer(nc, "TOKENWIRE", "telemetry", handler)
        await consumer.start()
        ...
        await consumer.stop()

        # manual ack, in batches: nothing is acked until the owner says so
        async def take(batch: list[ConsumedMessage]) -> None:
            held.extend(batch)  # ... later: await ack_many(held)

        PullConsumer(nc, stream, name, batch_handler=take, settings=PullSettings(auto_ack=False))
    """

    nc: Client
    stream: str
    consumer: str
    handler: Handler | None = None
    group: str | None = None
    settings: PullSettings = field(default_factory=PullSettings)
    dlq_subject: str | None = None
    clock: Callable[[], float] = time.monotonic
    stats: ConsumerStats = field(default_factory=ConsumerStats)
    batch_handler: BatchHandler | None = None
    _pin_id: str | None = field(default=None, init=False)
    _pulls: dict[str, _Pull] = field(default_factory=dict, init=False)
    _inbox: deque[ConsumedMessage] = field(default_factory=deque, init=False)
    _ready: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False)
    _sub: Subscription | None = field(default=None, init=False)
    _prefix: str = field(default="", init=False)
    _serial: int = field(default=0, init=False)
    _in_hand: int = field(default=0, init=False)
    _last_pull: float = field(default=0.0, init=False)
    _stopping: bool = field(default=False, init=False)
    _settled: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _offering: bool = field(default=True, init=False)
    _paused: bool = field(default=False, init=False)
    _void_pin: str | None = field(default=None, init=False)
    _late: set[asyncio.Task[None]] = field(default_factory=set, init=False)
    last_delivery: ConsumedMessage | None = field(default=None, init=False)
    """The latest message that arrived (its ``consumer_seq`` against the server's delivered
    count tells whether deliveries were lost on the way)."""

    def __post_init__(self) -> None:
        if (self.handler is None) == (self.batch_handler is None):
            raise ValueError("PullConsumer needs exactly one of handler or batch_handler")

    @property
    def offering(self) -> bool:
        """While unpinned, keep a standby pull open (False: stay out until set again, and
        decline a pin that a standby pull sent earlier still wins: see :meth:`_decline`)."""
        return self._offering

    @offering.setter
    def offering(self, value: bool) -> None:
        if value and not self._offering:
            self._wake.set()  # stand by now, not at the next tick
        self._offering = value

    @property
    def pinned(self) -> bool:
        """True while this client holds the group's pin (always True without a group)."""
        return self.group is None or self._pin_id is not None

    @property
    def pin_id(self) -> str | None:
        return self._pin_id

    @property
    def buffered(self) -> int:
        """Delivered messages waiting for or in the handler (bounded by ``settings.batch``)."""
        return len(self._inbox) + self._in_hand

    @property
    def waiting(self) -> int:
        """Delivered messages not yet handed to the handler."""
        return len(self._inbox)

    async def start(self) -> PullConsumer:
        self._prefix = self.nc.new_inbox() + "."
        self._sub = await self.nc.subscribe(self._prefix + "*", cb=self._on_msg)
        tap(self.nc, self._sub, self._on_raw)
        self._tasks = [
            asyncio.create_task(self._control(), name=f"pull-{self.consumer}"),
            asyncio.create_task(self._work(), name=f"work-{self.consumer}"),
        ]
        return self

    async def stop(self, timeout_s: float = 5.0, release: bool = True) -> None:
        """Stop pulling, let the current handler call finish (bounded), nak what is buffered.

        With ``release`` a pinned client also asks the server to unpin the group, so a standby
        takes over now instead of after the priority timeout. Messages a manual-ack owner
        still holds are the owner's to settle.
        """
        if not self._tasks:
            return
        control, worker = self._tasks
        self._tasks = []
        await cancel_task(control)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drain_current(), timeout_s)
        await cancel_task(worker)
        await self._nak_buffered()
        if self._sub is not None:
            untap(self.nc, self._sub)
        if self._sub is not None and not self.nc.is_closed:
            with contextlib.suppress(NatsError):
                await self._sub.unsubscribe()
        if release and self.group is not None and self._pin_id is not None:
            await self._unpin()
        self._pin_id = None

    @property
    def running(self) -> bool:
        """Started, not stopped, and neither loop ended (a loop that raised is dead)."""
        return bool(self._tasks) and not any(t.done() for t in self._tasks)

    @property
    def loops(self) -> list[asyncio.Task[None]]:
        """The pull and worker loops (named ``pull-<consumer>``, ``work-<consumer>``), which
        run from :meth:`start` to :meth:`stop`."""
        return list(self._tasks)

    @property
    def paused(self) -> bool:
        return self._paused

    async def pause(self, timeout_s: float = 5.0) -> bool:
        """Send no pulls (not even pin renewals) and hand no new batch to the handler; wait
        (bounded) for the current handler call. False when it did not finish in time."""
        self._paused = True
        try:
            if self._in_hand:
                await asyncio.wait_for(self._settled.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def release(self) -> str | None:
        """Give up the pin (UNPIN), nak what is buffered; stays paused. Returns the released
        pin id (None when this client held none)."""
        released = self._pin_id
        if released is not None and self.group is not None:
            await self._unpin()
        self._void_pin = released
        self._pin_id = None
        self._pulls.clear()
        await self._nak_buffered()
        return released

    def resume(self) -> None:
        """Pull again: as the owner if still pinned, else as a standby when ``offering``."""
        self._paused = False
        self._ready.set()
        self._wake.set()

    async def _drain_current(self) -> None:
        self._stopping = True
        if self._in_hand:
            await self._settled.wait()

    async def _nak_buffered(self) -> None:
        buffered = list(self._inbox)
        self._inbox.clear()
        if not self.nc.is_closed:
            await nak_many(buffered)

    async def _unpin(self) -> None:
        if self.group is not None:
            with contextlib.suppress(BrokerError):
                await unpin(self.nc, self.stream, self.consumer, self.group)

    # -- the pull loop ------------------------------------------------------------------------

    async def _control(self) -> None:
        while True:
            self._expire_pulls(self.clock())
            if self._paused:
                pass
            elif self.pinned:
                await self._top_up()
            elif not self._pulls and self._offering:
                await self._pull(1, self.settings.standby_expires_s)  # see _on_delivery
            self._wake.clear()
            tick = min(self.settings.standby_expires_s, self.settings.pin_keepalive_s) / 2
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(tick):  # not wait_for: on 3.11 it can swallow a
                    await self._wake.wait()  # cancellation racing the wake (stop() hung)

    def _in_flight(self) -> int:
        """Requested (not yet delivered) plus delivered-but-unhandled messages."""
        return sum(p.remaining for p in self._pulls.values()) + self.buffered

    async def _top_up(self) -> None:
        in_flight = self._in_flight()
        if in_flight <= self.settings.batch // 2:
            await self._pull(self.settings.batch - in_flight, self.settings.expires_s)
        elif self._keepalive_due(in_flight):
            await self._pull(1, self.settings.expires_s)

    def _keepalive_due(self, in_flight: int) -> bool:
        """A pinned client sent no pull for ``pin_keepalive_s``: renew the pin.

        The server unpins a client that sends no *new* pull request for the consumer's
        ``priority_timeout``, however long its open pulls last and whether or not a handler
        call is in progress; a live owner that lost its pin would hand a partition to a
        standby while still holding messages (ordering across two owners).
        """
        return (
            self.group is not None
            and self._pin_id is not None
            and in_flight < 2 * self.settings.batch
            and self.clock() - self._last_pull >= self.settings.pin_keepalive_s
        )

    def _expire_pulls(self, now: float) -> None:
        """Forget pulls the server should have ended by now (lost on a reconnect)."""
        for reply in [r for r, p in self._pulls.items() if p.deadline < now]:
            del self._pulls[reply]

    async def _pull(self, batch: int, expires_s: float) -> None:
        self._serial += 1
        reply = f"{self._prefix}{self._serial}"
        request: dict[str, Any] = {
            "batch": batch,
            "expires": int(expires_s * NS),
            "idle_heartbeat": int(expires_s / 2 * NS),
        }
        if self.group is not None:
            request["group"] = self.group
            if self._pin_id is not None:
                request["id"] = self._pin_id
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{self.consumer}"
        self._last_pull = self.clock()
        self._pulls[reply] = _Pull(batch, self._last_pull + expires_s + 2.0)
        self.stats.pulls += 1
        try:
            await self.nc.publish(subject, msgspec.json.encode(request), reply=reply)
        except NatsError:
            del self._pulls[reply]  # disconnected: the next round retries

    def _on_raw(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        """A message as nats-py's parser read it (``_replies.tap``); see :meth:`_on_msg`."""
        status = status_of(headers)
        if status is not None:
            self._on_status(status, subject.decode())
            return
        pin = header_value(headers, _PIN_FIELD)
        cm = ConsumedMessage(subject.decode(), reply.decode(), data, headers, pin, self.nc)
        self._on_delivery(cm)

    async def _on_msg(self, msg: Msg) -> None:
        """A message through nats-py's ``Msg`` path (when the tap is unavailable)."""
        status = msg.headers.get("Status") if msg.headers else None
        if status is not None:  # nats-py sets it only for an inline status of digits
            self._on_status(int(status), msg.subject)
            return
        pin = msg.headers.get(PIN_HEADER) if msg.headers else None
        self._on_delivery(ConsumedMessage.of(msg, pin, self.nc))

    def _on_status(self, status: int, subject: str) -> None:
        if status == _PIN_MOVED:
            self._lose_pin()
        elif status in _END_OF_PULL:
            self._pulls.pop(subject, None)
            self._wake.set()
        # 100: idle heartbeat; the pull deadline already covers a silent server

    def _on_delivery(self, cm: ConsumedMessage) -> None:
        pin = cm.pin_id
        if pin is not None and pin == self._void_pin:
            self._nak_late(cm)  # sent before our release: the next owner's
            return
        if pin is not None and pin != self._pin_id:
            if self._pin_id is None and not self._offering:
                self._decline(cm)
                return
            # A standby pull asks for one message (so a declined pin hands back one message,
            # not a batch): wake the pull loop, the owner's full pulls follow at once.
            self._pin_id = pin
            self.stats.pin_changes += 1
            self._wake.set()
        # A delivery carries the stream subject, not the pull's reply subject; the server
        # serves one client's waiting pulls first come, first served, so charge the oldest.
        oldest = next(iter(self._pulls), None)
        if oldest is not None:
            pull = self._pulls[oldest]
            pull.remaining -= 1
            if pull.remaining <= 0:
                del self._pulls[oldest]
        self.stats.delivered += 1
        self.last_delivery = cm
        self._inbox.append(cm)
        self._ready.set()

    def _decline(self, cm: ConsumedMessage) -> None:
        """A standby pull sent while offering won a pin after the owner stopped offering
        (its open pull outlives the decision by up to ``standby_expires_s``): hand the message
        back and release the pin, so the client that offers now gets the partition with the
        redelivery, instead of this one holding it until it hands it over later."""
        self._void_pin = cm.pin_id
        self._pulls.clear()
        self.stats.declined += 1
        log.info(
            "%s: declined a pin its earlier standby pull won (no longer offering)", self.consumer
        )

        async def decline() -> None:
            with contextlib.suppress(BrokerError):
                await cm.nak()
            await self._unpin()

        task = asyncio.ensure_future(decline())
        self._late.add(task)
        task.add_done_callback(self._late.discard)

    def _nak_late(self, cm: ConsumedMessage) -> None:
        """Hand back a delivery that arrived under a released pin (in a task: this runs in
        nats-py's reading task, which must not wait)."""

        async def nak() -> None:
            with contextlib.suppress(BrokerError):
                await cm.nak()

        task = asyncio.ensure_future(nak())
        self._late.add(task)
        task.add_done_callback(self._late.discard)

    def _lose_pin(self) -> None:
        """The server pinned another client: every pull carrying our old id is void."""
        if self._pin_id is not None:
            self.stats.pin_changes += 1
        self._pin_id = None
        self._pulls.clear()
        self._wake.set()

    # -- the worker -----------------------------------------------------------------------------

    async def _work(self) -> None:
        while not self._stopping:
            if not self._inbox or self._paused:
                self._ready.clear()
                await self._ready.wait()
                continue
            batch = self._next_batch()
            self._in_hand = len(batch)
            self._settled.clear()
            try:
                await self._dispatch(batch)
            finally:
                self._in_hand = 0
                self._settled.set()
                if self._in_flight() <= self.settings.batch // 2:
                    self._wake.set()  # time for a top-up pull

    def _next_batch(self) -> list[ConsumedMessage]:
        if self.batch_handler is None and not self.settings.concurrent:
            return [self._inbox.popleft()]
        batch = list(self._inbox)
        self._inbox.clear()
        return batch

    async def _call(self, batch: list[ConsumedMessage]) -> None:
        if self.batch_handler is not None:
            self.stats.batches += 1
            await self.batch_handler(batch)
        else:
            assert self.handler is not None  # __post_init__
            await self.handler(batch[0])

    async def _dispatch(self, batch: list[ConsumedMessage]) -> None:
        if self.batch_handler is None and len(batch) > 1:  # concurrent handler calls
            await asyncio.gather(*(self._settle([cm]) for cm in batch))
        else:
            await self._settle(batch)

    async def _settle(self, batch: list[ConsumedMessage]) -> None:
        """Call the handler and settle the messages by its outcome."""
        try:
            await self._call(batch)
        except Retry as retry:
            await self._retry(batch, retry.delay_s)
        except Reject as reject:
            for cm in _unsettled(batch):
                await self._reject(cm, reject.reason)
        except Exception as exc:
            log.exception("handler failed on %s seq %s", self.consumer, seq_of(batch[0]))
            await self._failed(batch, f"{type(exc).__name__}: {exc}")
        else:
            if self.settings.auto_ack:
                await ack_many(batch)
            self.stats.handled += len(batch)

    async def _retry(self, batch: list[ConsumedMessage], delay_s: float) -> None:
        unsettled = _unsettled(batch)
        self.stats.retried += len(unsettled)
        await nak_many(unsettled, delay_s)

    async def _failed(self, batch: list[ConsumedMessage], reason: str) -> None:
        """An unexpected error: nak with backoff, dead-letter on the last allowed delivery."""
        unsettled = _unsettled(batch)
        last = [cm for cm in unsettled if cm.num_delivered >= self.settings.max_deliver]
        for cm in last:
            await self._reject(cm, reason)
        await self._retry(
            [cm for cm in unsettled if not cm.resolved], self.settings.retry_backoff_s
        )

    async def _reject(self, cm: ConsumedMessage, reason: str) -> None:
        if self.dlq_subject is None:
            with contextlib.suppress(BrokerError):  # unsettled: redelivered after ack_wait
                await cm.term()
        elif not await dead_letter(
            self.nc, self.dlq_subject, cm, stream=self.stream, reason=reason, timeout_s=5.0
        ):
            return  # unsettled: redelivered after ack_wait and dead-lettered then
        self.stats.rejected += 1


def _unsettled(batch: list[ConsumedMessage]) -> list[ConsumedMessage]:
    return [cm for cm in batch if not cm.resolved]
