"""Callback-driven pull consumers, with JetStream priority groups (``pinned_client``).

nats-py's ``fetch()`` is the slow consume path (~20k msg/s) and it has no priority-group
support, so this is the narrow fast path: one wildcard inbox subscription per consumer, every
pull request (``$JS.API.CONSUMER.MSG.NEXT``) gets its own reply subject under it, so
deliveries and status messages (100 heartbeat, 404/408 end of a pull, 409, 423 pin mismatch)
are accounted per pull (status messages arrive on the pull's reply subject; deliveries are
charged to the oldest open pull, the order the server serves them), like nats.go's
``Consume()``.

Flow control: messages requested but not yet handled never exceed ``batch``; a top-up is sent
when they fall to half. One worker task per consumer calls the handler one message at a time,
in delivery order, so a partition is never processed concurrently with itself.

Pinning (ADR-42): a grouped consumer that holds no pin keeps one pull without ``id``
outstanding (a standby, polling every ``standby_expires_s``). When the server pins it, the
first delivered message carries ``Nats-Pin-Id`` and later pulls repeat that id. A 423 means the
server moved the pin to another client: drop the id and go back to standby.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.js.errors import Error as JsError

from tokenwire.broker._api import NS, ApiError, api_request

log = logging.getLogger(__name__)

PIN_HEADER = "Nats-Pin-Id"
_END_OF_PULL = frozenset({"404", "408", "409"})


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


class ConsumedMessage:
    """One delivered JetStream message: payload, headers, sequence and the ack verbs."""

    __slots__ = ("_msg", "pin_id")

    def __init__(self, msg: Msg, pin_id: str | None) -> None:
        self._msg = msg
        self.pin_id = pin_id

    @property
    def subject(self) -> str:
        return self._msg.subject

    @property
    def data(self) -> bytes:
        return self._msg.data

    @property
    def headers(self) -> dict[str, str]:
        return self._msg.headers or {}

    @property
    def stream_seq(self) -> int:
        seq: int = self._msg.metadata.sequence.stream
        return seq

    @property
    def num_delivered(self) -> int:
        n: int = self._msg.metadata.num_delivered
        return n

    @property
    def resolved(self) -> bool:
        """True once acked, naked or terminated."""
        return bool(self._msg.is_acked)

    async def ack(self) -> None:
        await self._msg.ack()

    async def nak(self, delay_s: float | None = None) -> None:
        await self._msg.nak(delay_s)

    async def term(self) -> None:
        await self._msg.term()

    async def in_progress(self) -> None:
        """Reset the ack timer for long work; may be sent many times."""
        await self._msg.in_progress()


Handler = Callable[[ConsumedMessage], Awaitable[None]]
"""Return -> ack; raise Retry -> nak with delay; raise Reject -> term + dead-letter;
any other exception -> nak with backoff, dead-lettered on the last allowed delivery."""


@dataclass(slots=True)
class _Pull:
    remaining: int
    deadline: float


@dataclass(frozen=True, slots=True)
class PullSettings:
    """Sizing of the pull loop. ``batch`` bounds requested-but-unhandled messages."""

    batch: int = 256
    expires_s: float = 5.0
    standby_expires_s: float = 2.0
    max_deliver: int = 10
    retry_backoff_s: float = 1.0


@dataclass
class ConsumerStats:
    """Counters of one consumer (delivered, handled, retried, rejected, pulls sent)."""

    delivered: int = 0
    handled: int = 0
    retried: int = 0
    rejected: int = 0
    pulls: int = 0
    pin_changes: int = 0


@dataclass
class PullConsumer:
    """A durable pull consumer driven by a callback loop; ``group`` enables pinned_client.

    ::

        consumer = PullConsumer(nc, "TOKENWIRE", "telemetry", handler)
        await consumer.start()
        ...
        await consumer.stop()
    """

    nc: Client
    stream: str
    consumer: str
    handler: Handler
    group: str | None = None
    settings: PullSettings = field(default_factory=PullSettings)
    dlq_subject: str | None = None
    clock: Callable[[], float] = time.monotonic
    stats: ConsumerStats = field(default_factory=ConsumerStats)
    _pin_id: str | None = field(default=None, init=False)
    _pulls: dict[str, _Pull] = field(default_factory=dict, init=False)
    _queue: asyncio.Queue[ConsumedMessage] = field(default_factory=asyncio.Queue, init=False)
    _wake: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list, init=False)
    _sub: Subscription | None = field(default=None, init=False)
    _prefix: str = field(default="", init=False)
    _serial: int = field(default=0, init=False)
    _busy: bool = field(default=False, init=False)
    _stopping: bool = field(default=False, init=False)
    _settled: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    @property
    def pinned(self) -> bool:
        """True while this client holds the group's pin (always True without a group)."""
        return self.group is None or self._pin_id is not None

    @property
    def pin_id(self) -> str | None:
        return self._pin_id

    @property
    def buffered(self) -> int:
        """Delivered messages waiting for the handler (bounded by ``settings.batch``)."""
        return self._queue.qsize() + self._busy

    async def start(self) -> PullConsumer:
        self._prefix = self.nc.new_inbox() + "."
        self._sub = await self.nc.subscribe(self._prefix + "*", cb=self._on_msg)
        self._tasks = [
            asyncio.create_task(self._control(), name=f"pull-{self.consumer}"),
            asyncio.create_task(self._work(), name=f"work-{self.consumer}"),
        ]
        return self

    async def stop(self, timeout_s: float = 5.0, release: bool = True) -> None:
        """Stop pulling, let the current handler finish (bounded), nak what is buffered.

        With ``release`` a pinned client also asks the server to unpin the group, so a standby
        takes over now instead of after the priority timeout.
        """
        if not self._tasks:
            return
        control, worker = self._tasks
        self._tasks = []
        control.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await control
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drain_current(), timeout_s)
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        await self._nak_buffered()
        if self._sub is not None and not self.nc.is_closed:
            with contextlib.suppress(NatsError):
                await self._sub.unsubscribe()
        if release and self.group is not None and self._pin_id is not None:
            await self._unpin()
        self._pin_id = None

    async def _drain_current(self) -> None:
        self._stopping = True
        if self._busy:
            await self._settled.wait()

    async def _nak_buffered(self) -> None:
        while not self._queue.empty():
            cm = self._queue.get_nowait()
            if not self.nc.is_closed:
                with contextlib.suppress(NatsError):
                    await cm.nak()

    async def _unpin(self) -> None:
        subject = f"$JS.API.CONSUMER.UNPIN.{self.stream}.{self.consumer}"
        with contextlib.suppress(ApiError, NatsError):
            await api_request(self.nc, subject, {"group": self.group}, timeout_s=2.0)

    # -- the pull loop ------------------------------------------------------------------------

    async def _control(self) -> None:
        while True:
            self._expire_pulls(self.clock())
            if self.pinned:
                await self._top_up()
            elif not self._pulls:
                await self._pull(self.settings.batch, self.settings.standby_expires_s)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.standby_expires_s / 2)

    async def _top_up(self) -> None:
        requested = sum(p.remaining for p in self._pulls.values())
        in_hand = requested + self.buffered
        if in_hand <= self.settings.batch // 2:
            await self._pull(self.settings.batch - in_hand, self.settings.expires_s)

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
        self._pulls[reply] = _Pull(batch, self.clock() + expires_s + 2.0)
        self.stats.pulls += 1
        try:
            await self.nc.publish(subject, msgspec.json.encode(request), reply=reply)
        except NatsError:
            del self._pulls[reply]  # disconnected: the next round retries

    async def _on_msg(self, msg: Msg) -> None:
        status = msg.headers.get("Status") if msg.headers else None
        if status is None:
            self._on_delivery(msg)
        elif status == "423":
            self._lose_pin()
        elif status in _END_OF_PULL:
            self._pulls.pop(msg.subject, None)
            self._wake.set()
        # 100: idle heartbeat; the pull deadline already covers a silent server

    def _on_delivery(self, msg: Msg) -> None:
        pin = msg.headers.get(PIN_HEADER) if msg.headers else None
        if pin is not None and pin != self._pin_id:
            self._pin_id = pin
            self.stats.pin_changes += 1
        # A delivery carries the stream subject, not the pull's reply subject; the server
        # serves one client's waiting pulls first come, first served, so charge the oldest.
        oldest = next(iter(self._pulls), None)
        if oldest is not None:
            pull = self._pulls[oldest]
            pull.remaining -= 1
            if pull.remaining <= 0:
                del self._pulls[oldest]
        self.stats.delivered += 1
        self._queue.put_nowait(ConsumedMessage(msg, pin))

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
            cm = await self._queue.get()
            self._busy = True
            self._settled.clear()
            try:
                await self._dispatch(cm)
            finally:
                self._busy = False
                self._settled.set()
                self._wake.set()

    async def _dispatch(self, cm: ConsumedMessage) -> None:
        try:
            await self.handler(cm)
        except Retry as retry:
            await self._settle(cm.nak(retry.delay_s), retried=True)
        except Reject as reject:
            await self._reject(cm, reject.reason)
        except Exception as exc:
            log.exception("handler failed on %s seq %s", self.consumer, _seq(cm))
            if cm.num_delivered >= self.settings.max_deliver:
                await self._reject(cm, f"{type(exc).__name__}: {exc}")
            else:
                await self._settle(cm.nak(self.settings.retry_backoff_s), retried=True)
        else:
            if not cm.resolved:
                await self._settle(cm.ack())
            self.stats.handled += 1

    async def _settle(self, verb: Awaitable[None], retried: bool = False) -> None:
        self.stats.retried += retried
        try:
            await verb
        except NatsError:
            # Unacked: the server redelivers after ack_wait, which is the safe outcome.
            log.warning("could not settle a message on %s", self.consumer)

    async def _reject(self, cm: ConsumedMessage, reason: str) -> None:
        if self.dlq_subject is not None:
            headers = {
                "Tokenwire-Reason": reason[:512],
                "Tokenwire-Subject": cm.subject,
                "Tokenwire-Stream-Seq": str(_seq(cm)),
            }
            try:
                await self.nc.jetstream().publish(
                    self.dlq_subject, cm.data, headers=headers, timeout=5.0
                )
            except (NatsError, JsError):
                log.error("could not dead-letter seq %s of %s", _seq(cm), self.consumer)
        await self._settle(cm.term())
        self.stats.rejected += 1


def _seq(cm: ConsumedMessage) -> int:
    try:
        return cm.stream_seq
    except NatsError:
        return -1
