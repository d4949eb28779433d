"""``BoundedRead``: an ordered read of one subject that holds at most a window in flight.

Every session read (replay, tail, verify, rebuild, the events endpoint) goes through it,
instead of nats-py's ordered push consumer, whose queue grows for as long as the server lets
deliveries come (docs/replay.md, "Performance"). Here an ephemeral pull consumer (created by
name, the form least privilege allows, ADR 0015) answers only our own pulls: messages
requested and not yet handed out never exceed :class:`ReadWindow`'s messages or bytes, pulls
go only from :meth:`BoundedRead.take`, and a reader that stops taking stops pulling (the
server deletes its consumer after ``inactive_s``; it is recreated on return). A gap in the
consumer sequence, or a pull that hears nothing for ``3 * heartbeat_s``, recreates the
consumer after the last message handed out, as nats-py's ordered consumer does.
docs/broker.md, "Reading a session".
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from tokenwire.broker._api import NS, ApiError, api_request, server_url
from tokenwire.broker._errors import BrokerUnavailable
from tokenwire.broker._ordered import reader_name
from tokenwire.broker._replies import status_of, tap, untap

_HEARTBEAT = 100
_END_OF_PULL = frozenset({404, 408, 409})
_NO_RESPONDERS = 503
_CONSUMER_LOST = (b"Consumer Deleted", b"Leadership Change", b"Consumer is push based")
_TOO_LARGE = b"Exceeds MaxBytes"


@dataclass(frozen=True, slots=True)
class ReadWindow:
    """The most one reader has in flight: messages requested from the server and not yet
    handed to its caller (``messages``), and their bytes (``bytes``; a single message larger
    than that is fetched alone). The defaults hold ~256 KiB of typical chunks per reader."""

    messages: int = 512
    bytes: int = 1024 * 1024

    def __post_init__(self) -> None:
        if self.messages < 2 or self.bytes < 1024:
            raise ValueError(f"a read window needs >= 2 messages and >= 1024 bytes: {self}")


Delivery = tuple[int, bytes, bytes, bytes | None, int]
"""``(stream seq, payload, subject, raw header block or None, pending)`` of one message."""


@dataclass(slots=True)
class _Pull:
    remaining: int
    bytes: int
    deadline: float
    delivered: int = 0


class BoundedRead:
    """One ordered, windowed read of ``subject`` from ``start_seq`` (see the module).

    ::

        read = BoundedRead(nc, "TOKENWIRE", "tw.chunks.3.s-42.*", 1)
        due = await read.open()  # what the consumer counts as stored from start_seq on
        try:
            batch = await read.take(timeout_s=10.0)  # [] after the timeout
        finally:
            await read.close()

    ``limit`` (messages still wanted; None: no end) keeps pulls from asking past what the
    caller will take.
    """

    def __init__(
        self,
        nc: Client,
        stream: str,
        subject: str,
        start_seq: int,
        *,
        window: ReadWindow | None = None,
        heartbeat_s: float = 2.0,
        expires_s: float = 30.0,
        inactive_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nc = nc
        self._stream = stream
        self._subject = subject
        self._window = window or ReadWindow()
        self._heartbeat = heartbeat_s
        self._expires = max(expires_s, 2 * heartbeat_s)
        self._inactive = inactive_s
        self._clock = clock
        self.limit: int | None = None
        self.last_seq = start_seq - 1
        self.recreated = 0
        self._name = b""
        self._cseq = 0
        self._items: list[Delivery] = []
        self._item_bytes = 0
        self._pulls: dict[str, _Pull] = {}
        self._serial = 0
        self._prefix = ""
        self._sub: Subscription | None = None
        self._signal = asyncio.Event()
        self._heard = False
        self._lost = False
        self._oversize = False

    # -- life cycle ---------------------------------------------------------------------------

    async def open(self) -> int:
        """Subscribe the inbox and create the consumer; how many messages it holds from the
        start sequence on (its ``num_pending`` at creation)."""
        self._prefix = self._nc.new_inbox() + "."
        try:
            self._sub = await self._nc.subscribe(self._prefix + "*", cb=self._on_msg)
        except NatsError as exc:
            raise BrokerUnavailable(server_url(self._nc), f"cannot read: {exc}") from exc
        tap(self._nc, self._sub, self._on_raw)
        return await self._create()

    async def close(self) -> None:
        """Stop, unsubscribe, delete the consumer now (not after its inactive threshold)."""
        if self._sub is not None:
            untap(self._nc, self._sub)
            if not self._nc.is_closed:
                with contextlib.suppress(NatsError):
                    await self._sub.unsubscribe()
            self._sub = None
        await self._delete(self._name.decode())
        self._items, self._pulls = [], {}

    async def _create(self) -> int:
        name = reader_name()
        start = self.last_seq + 1
        config: dict[str, Any] = {
            "name": name,
            "ack_policy": "none",
            "filter_subject": self._subject,
            "inactive_threshold": int(self._inactive * NS),
            "mem_storage": True,
            "num_replicas": 1,
        }
        if start > 1:
            config |= {"deliver_policy": "by_start_sequence", "opt_start_seq": start}
        else:
            config["deliver_policy"] = "all"
        subject = f"$JS.API.CONSUMER.CREATE.{self._stream}.{name}.{self._subject}"
        body = {"stream_name": self._stream, "config": config, "action": "create"}
        try:
            info = await api_request(self._nc, subject, body)
        except (ApiError, NatsError) as exc:
            reason = f"cannot read {self._subject}: {exc}"
            raise BrokerUnavailable(server_url(self._nc), reason) from exc
        self._name, self._cseq = name.encode(), 0
        self._pulls.clear()
        self._lost = self._oversize = False
        return int(info.get("num_pending", 0))

    async def _delete(self, name: str) -> None:
        if not name or self._nc.is_closed:
            return
        subject = f"$JS.API.CONSUMER.DELETE.{self._stream}.{name}"
        with contextlib.suppress(ApiError, NatsError, TimeoutError):
            await api_request(self._nc, subject, timeout_s=2.0)

    async def _recreate(self) -> None:
        """From the stream sequence after the last one handed out or buffered."""
        old = self._name.decode()
        self._items, self._item_bytes = [], 0  # re-read: they follow last_seq in order
        self.recreated += 1
        await self._create()
        await self._delete(old)  # best effort (bounded); it would expire anyway

    # -- the caller's side ----------------------------------------------------------------------

    async def take(self, timeout_s: float | None) -> list[Delivery]:
        """Everything delivered since the last call, in stream order, waiting up to
        ``timeout_s`` (None: for ever) for at least one message; [] past the timeout."""
        deadline = None if timeout_s is None else self._clock() + timeout_s
        silent = 0.0
        while not self._items:
            # Cleared before anything that yields to the loop: a delivery arriving meanwhile
            # sets it again, so the wait below cannot miss it.
            self._signal.clear()
            self._heard = False
            if self._lost:
                await self._recreate()
            await self._top_up()
            if self._items:
                break
            wait = self._heartbeat
            if deadline is not None:
                wait = min(wait, deadline - self._clock())
                if wait <= 0:
                    return []
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._signal.wait()
            silent = 0.0 if (self._heard or not self._pulls) else silent + wait
            if silent >= 3 * self._heartbeat:
                self._lost, silent = True, 0.0
        items, self._items, self._item_bytes = self._items, [], 0
        self.last_seq = items[-1][0]
        if self.limit is not None:
            self.limit -= len(items)
        await self._top_up()  # the next messages come while the caller works
        return items

    async def _top_up(self) -> None:
        w = self._window
        self._expire_pulls()
        pulls = self._pulls.values()
        wanted = sum(p.remaining for p in pulls) + len(self._items)
        free = w.messages - wanted
        if self.limit is not None:
            free = min(free, self.limit - wanted)
        if free <= 0:
            return
        if self._oversize:
            if not self._items and not self._pulls:
                await self._pull(1, 0)
            return
        free_bytes = w.bytes - self._item_bytes - sum(p.bytes for p in pulls)
        if free >= min(w.messages // 2, self.limit or w.messages) and free_bytes >= w.bytes // 2:
            await self._pull(free, free_bytes)

    def _expire_pulls(self) -> None:
        """Forget pulls the server should have ended by now (lost on a reconnect)."""
        now = self._clock()
        for reply in [r for r, p in self._pulls.items() if p.deadline < now]:
            del self._pulls[reply]

    async def _pull(self, batch: int, max_bytes: int) -> None:
        self._serial += 1
        reply = f"{self._prefix}{self._serial}"
        request: dict[str, Any] = {
            "batch": batch,
            "expires": int(self._expires * NS),
            "idle_heartbeat": int(self._heartbeat * NS),
        }
        if max_bytes:
            request["max_bytes"] = max_bytes
        self._pulls[reply] = _Pull(batch, max_bytes, self._clock() + self._expires + 2.0)
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{self._stream}.{self._name.decode()}"
        try:
            await self._nc.publish(subject, msgspec.json.encode(request), reply=reply)
        except NatsError:
            del self._pulls[reply]  # disconnected: the next take() pulls again

    # -- deliveries (in nats-py's reading task: never wait here) ------------------------------

    def _on_raw(self, subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
        status = status_of(headers)
        if status is not None:
            self._on_status(status, subject.decode(), headers or b"")
            return
        self._on_delivery(subject, reply, data, headers)

    async def _on_msg(self, msg: Msg) -> None:
        """nats-py's ``Msg`` path (when the tap is unavailable): the same handlers."""
        status = msg.headers.get("Status") if msg.headers else None
        if status is not None:
            described = f"{msg.headers.get('Description', '')}".encode() if msg.headers else b""
            self._on_status(int(status) if status.isdigit() else 0, msg.subject, described)
            return
        block = _header_block(msg.headers)
        self._on_delivery(msg.subject.encode(), msg.reply.encode(), msg.data, block)

    def _on_status(self, status: int, subject: str, headers: bytes) -> None:
        self._heard = True
        if status == _HEARTBEAT:
            return
        pull = self._pulls.pop(subject, None)
        if status == _NO_RESPONDERS or any(m in headers for m in _CONSUMER_LOST):
            self._lost = True
        elif _TOO_LARGE in headers and pull is not None and pull.delivered == 0:
            self._oversize = True  # the next message is larger than the window: alone
        self._signal.set()

    def _on_delivery(self, subject: bytes, reply: bytes, data: bytes, hdr: bytes | None) -> None:
        self._heard = True
        tokens = reply.split(b".")
        at = 3 if len(tokens) == 9 else 5  # $JS.ACK.<stream>.<consumer>... or with a domain
        if len(tokens) < 9 or tokens[at] != self._name or self._lost:
            return  # a replaced consumer's, or not a JetStream delivery
        cseq = int(tokens[at + 3])
        if cseq != self._cseq + 1:
            self._lost = True  # a gap: recreate from the last seq we hold
            self._signal.set()
            return
        self._cseq = cseq
        size = len(data) + len(subject) + (len(hdr) if hdr else 0)
        self._charge(size)
        self._items.append((int(tokens[at + 2]), data, subject, hdr, int(tokens[at + 5])))
        self._item_bytes += size
        self._oversize = False
        if len(self._items) == 1:
            self._signal.set()

    def _charge(self, size: int) -> None:
        """Count a delivery against the oldest open pull (the server serves them in order)."""
        for reply, pull in self._pulls.items():
            pull.remaining -= 1
            pull.bytes = max(0, pull.bytes - size)
            pull.delivered += 1
            if pull.remaining <= 0:
                del self._pulls[reply]
            return


def _header_block(headers: dict[str, str] | None) -> bytes | None:
    if not headers:
        return None
    lines = [b"NATS/1.0"] + [f"{k}: {v}".encode() for k, v in headers.items()]
    return b"\r\n".join(lines) + b"\r\n\r\n"
