"""The narrow fast path under replay: one session's stored chunks, in batches.

Why not :class:`tokenwire.broker.SessionReader`: its ``next_msg`` creates a task and a
timeout per message, which caps a replay at ~35k chunks/s here against ~175k/s for nats-py's
ordered consumer driven by a callback (measured by bench/bench_replay.py). This reader uses the
same ordered consumer (an ephemeral, flow-controlled push consumer that nats-py recreates from
the last sequence on a gap) with a callback that appends to a bounded batch; the reading side
swaps the whole batch out at once.

Bounds: the batch holds at most ``max_batch`` messages; when it is full the callback waits,
which stalls only this reader's own ephemeral consumer (the server's flow control then pauses
it), never the pipeline's durable consumers. A replay waiting ``idle_timeout_s`` for a message
it knows is due raises :class:`ReaderStalled` (replay translates it to ``ReplayStalled``).

What is due comes from the stream's leader: the ephemeral consumer lives on one replica of the
stream, any of them, and counts only what that replica holds. Right after a node restart its
replica may still be catching up, and a count taken there ended a replay short ("retained 23
of 28 chunks"). A read from the start therefore asks the leader (stream info with the session's
filter, answered by the leader only) how many of the session's chunks it holds, and waits for
the consumer to deliver that many: a lagging replica delivers the rest as it catches up, and
one that does not within ``idle_timeout_s`` ends the read with :class:`ReaderStalled`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import api
from nats.js.errors import Error as JsError

from tokenwire.broker._api import server_url
from tokenwire.broker._errors import BrokerUnavailable, ReaderStalled, TopologyError
from tokenwire.broker._layout import locate_session
from tokenwire.broker._ordered import ordered_subscribe
from tokenwire.broker._topology import Topology

READ_MAX_BATCH = 4096
READ_IDLE_TIMEOUT_S = 10.0
_INACTIVE_THRESHOLD_S = 30.0
_HEARTBEAT_S = 2.0


RawChunk = tuple[int, bytes]
"""One stored message of the session: ``(stream seq, payload)`` (a tuple: the hot path)."""


class _Batch:
    """What the callback has delivered and the reader has not taken yet (bounded)."""

    __slots__ = ("items", "ready", "room", "size")

    def __init__(self, size: int) -> None:
        self.items: list[Msg] = []
        self.size = size
        self.ready = asyncio.Event()
        self.room = asyncio.Event()
        self.room.set()

    async def put(self, msg: Msg) -> None:
        items = self.items
        items.append(msg)
        if len(items) == 1:
            self.ready.set()
        if len(items) >= self.size:
            self.room.clear()
            await self.room.wait()

    def take(self) -> list[Msg]:
        items, self.items = self.items, []
        self.ready.clear()
        self.room.set()
        return items


async def session_batches(
    nc: Client,
    topology: Topology,
    session: str,
    from_seq: int | None = None,
    *,
    follow: bool = False,
    max_batch: int = READ_MAX_BATCH,
    idle_timeout_s: float = READ_IDLE_TIMEOUT_S,
) -> AsyncGenerator[list[RawChunk], None]:
    """Yield the session's stored chunks from ``from_seq`` (inclusive) in stream order, in
    batches. Without ``follow`` it stops once caught up (what is due is fixed when the read
    starts); with ``follow`` it waits for new chunks until the caller stops iterating.

    The session is read from its layout's stream (``topology.stream_of``), or from a retired
    layout's stream that still holds it when the current one does not (``locate_session``)."""
    batch = _Batch(max_batch)
    topology = await _located(nc, topology, session)
    sub = await _subscribe(nc, topology, session, from_seq, batch)
    try:
        # What is due is counted when the consumer exists: the first `due` messages it
        # delivers are exactly those (an ordered consumer never repeats one).
        remaining = None if follow else await _due(nc, topology, session, sub, from_seq)
        last = (from_seq or 1) - 1
        while remaining is None or remaining > 0:
            if not batch.items:
                idle = idle_timeout_s if remaining is not None else None
                await _wait(batch, session, last, idle)
            raw = _convert(batch.take(), remaining)
            last = raw[-1][0]
            if remaining is not None:
                remaining -= len(raw)
            yield raw
    finally:
        await _close(nc, topology, session, sub)


async def _located(nc: Client, topology: Topology, session: str) -> Topology:
    """The layout holding the session (a retired one after ``tokenwire reshard``)."""
    try:
        return await locate_session(nc, topology, session)
    except TopologyError as exc:
        raise BrokerUnavailable(server_url(nc), f"cannot locate {session}: {exc}") from exc


def _convert(msgs: list[Msg], remaining: int | None) -> list[RawChunk]:
    """The batch as (seq, payload), cut at what is still due."""
    if remaining is not None and len(msgs) > remaining:
        msgs = msgs[:remaining]
    out = []
    for msg in msgs:
        tokens = msg.reply.split(".")
        out.append((int(tokens[5] if len(tokens) == 9 else tokens[7]), msg.data))
    return out


async def _wait(batch: _Batch, session: str, last: int, idle_s: float | None) -> None:
    try:
        await asyncio.wait_for(batch.ready.wait(), idle_s)
    except TimeoutError:
        raise ReaderStalled(session, idle_s or 0.0, last) from None


async def _subscribe(
    nc: Client, topology: Topology, session: str, from_seq: int | None, batch: _Batch
) -> object:
    if from_seq is not None and from_seq > 1:
        config = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=from_seq,
            inactive_threshold=_INACTIVE_THRESHOLD_S,
        )
    else:
        config = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.ALL, inactive_threshold=_INACTIVE_THRESHOLD_S
        )
    try:
        return await ordered_subscribe(
            nc.jetstream(),
            topology.session_filter(session),
            stream=topology.stream_of(session),
            config=config,
            idle_heartbeat=_HEARTBEAT_S,
            cb=batch.put,
        )
    except (JsError, NatsError) as exc:
        raise BrokerUnavailable(server_url(nc), f"cannot read {session}: {exc}") from exc


async def _due(
    nc: Client, topology: Topology, session: str, sub: object, from_seq: int | None
) -> int:
    """How many messages the read must deliver: what the consumer had to deliver when it was
    created and, for a read from the start, at least what the stream's leader holds of the
    session then (see the module; a read from a later seq keeps the consumer's count)."""
    try:
        info = await sub.consumer_info()  # type: ignore[attr-defined]  # sub: ordered_subscribe's PushSubscription
        local = int(info.num_pending) + int(info.delivered.consumer_seq)
        if from_seq is not None and from_seq > 1:
            return local
        return max(local, await _leader_count(nc, topology, session))
    except (TimeoutError, JsError, NatsError) as exc:
        raise BrokerUnavailable(server_url(nc), f"cannot count {session}: {exc}") from exc


async def _leader_count(nc: Client, topology: Topology, session: str) -> int:
    """The session's chunks in the stream, as its leader holds them (stream info is answered
    by the leader, never by a follower)."""
    stream = await nc.jetstream().stream_info(
        topology.stream_of(session), topology.session_filter(session)
    )
    return sum((stream.state.subjects or {}).values())


async def _close(nc: Client, topology: Topology, session: str, sub: object) -> None:
    """Unsubscribe and delete the ephemeral consumer now (not after the inactive threshold)."""
    with contextlib.suppress(NatsError, JsError, asyncio.TimeoutError):
        name = getattr(sub, "_consumer", None)
        await sub.unsubscribe()  # type: ignore[attr-defined]  # the subscription is kept as an object (see _subscribe)
        if name and not nc.is_closed:
            await nc.jetstream().delete_consumer(topology.stream_of(session), name)
