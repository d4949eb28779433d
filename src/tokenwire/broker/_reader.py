"""``SessionReader``: an ordered read of one session from the chunk stream (replay, tail, SSE).

It reads ``<prefix>.chunks.<p>.<session>.*`` with nats-py's ordered consumer (an ephemeral,
flow-controlled push consumer that nats-py recreates from the last sequence on a gap), from a
stream sequence or from the beginning. ``replay()`` stops once caught up; ``tail()`` follows
live until the caller stops iterating.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import api
from nats.js.errors import Error as JsError

from tokenwire.broker._api import server_url
from tokenwire.broker._errors import BrokerUnavailable, ReaderStalled, TopologyError
from tokenwire.broker._layout import locate_session
from tokenwire.broker._ordered import ordered_subscribe
from tokenwire.broker._topology import Topology


@dataclass(frozen=True, slots=True)
class StoredChunk:
    """One stored message of a session: its stream sequence, subject, headers and payload."""

    stream_seq: int
    subject: str
    headers: dict[str, str]
    payload: bytes
    num_pending: int


class SessionReader:
    """Ordered reader of one session.

    ::

        reader = SessionReader(nc, topology, "s-42", from_seq=1000)
        async for chunk in reader.replay():
            envelope = envelope_decoder.decode(chunk.payload)

    ``idle_timeout_s`` bounds how long a replay waits for a message it knows is due
    (ReaderStalled past it); ``poll_s`` is the granularity at which ``tail()`` can be stopped.
    """

    def __init__(
        self,
        nc: Client,
        topology: Topology,
        session: str,
        *,
        from_seq: int | None = None,
        idle_timeout_s: float = 10.0,
        poll_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nc = nc
        self._topology = topology
        self._session = session
        self._from_seq = from_seq
        self._idle_timeout = idle_timeout_s
        self._poll = poll_s
        self._clock = clock

    async def _subscribe(self) -> object:
        try:
            self._topology = await locate_session(self._nc, self._topology, self._session)
        except TopologyError as exc:
            reason = f"cannot locate {self._session}: {exc}"
            raise BrokerUnavailable(server_url(self._nc), reason) from exc
        if self._from_seq is not None and self._from_seq > 1:
            config = api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=self._from_seq,
                inactive_threshold=30.0,
            )
        else:
            config = api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.ALL, inactive_threshold=30.0
            )
        try:
            return await ordered_subscribe(
                self._nc.jetstream(),
                self._topology.session_filter(self._session),
                stream=self._topology.stream_of(self._session),
                config=config,
                idle_heartbeat=2.0,
            )
        except (JsError, NatsError) as exc:
            reason = f"cannot read {self._session}: {exc}"
            raise BrokerUnavailable(server_url(self._nc), reason) from exc

    async def replay(self) -> AsyncIterator[StoredChunk]:
        """Yield the session's stored chunks in stream order, then stop (caught up).

        What is caught up is fixed when the read starts: chunks appended while replaying are
        included only if they arrive before the last one that was due.
        """
        sub = await self._subscribe()
        try:
            info = await sub.consumer_info()  # type: ignore[attr-defined]  # a PushSubscription
            due = int(info.num_pending) + int(info.delivered.consumer_seq)
            seen = 0
            last_seq = (self._from_seq or 1) - 1
            while seen < due:
                msg = await self._next(sub, last_seq)
                chunk = _to_chunk(msg)
                seen += 1
                last_seq = chunk.stream_seq
                yield chunk
                if chunk.num_pending == 0:
                    return
        finally:
            await _unsubscribe(sub)

    async def _next(self, sub: object, last_seq: int) -> Msg:
        started = self._clock()
        while True:
            try:
                msg: Msg = await sub.next_msg(timeout=self._poll)  # type: ignore[attr-defined]  # js.subscribe's stub returns a Subscription, not a PushSubscription
                return msg
            except NatsTimeoutError:
                if self._clock() - started >= self._idle_timeout:
                    raise ReaderStalled(self._session, self._clock() - started, last_seq) from None

    async def tail(self) -> AsyncIterator[StoredChunk]:
        """Yield stored chunks from the start position, then live ones, until closed."""
        sub = await self._subscribe()
        try:
            while True:
                try:
                    msg = await sub.next_msg(timeout=self._poll)  # type: ignore[attr-defined]  # js.subscribe's stub returns a Subscription, not a PushSubscription
                except NatsTimeoutError:
                    continue
                yield _to_chunk(msg)
        finally:
            await _unsubscribe(sub)


def _to_chunk(msg: Msg) -> StoredChunk:
    meta = msg.metadata
    return StoredChunk(
        stream_seq=meta.sequence.stream,
        subject=msg.subject,
        headers=dict(msg.headers or {}),
        payload=msg.data,
        num_pending=meta.num_pending,
    )


async def _unsubscribe(sub: object) -> None:
    with contextlib.suppress(NatsError, JsError):
        await sub.unsubscribe()  # type: ignore[attr-defined]  # js.subscribe's stub returns a Subscription, not a PushSubscription
