"""The narrow fast path under replay: one session's stored chunks, in batches.

A :class:`~tokenwire.broker._bounded.BoundedRead` of the session's subjects: an ephemeral
pull consumer asked for at most a window of messages at a time (``window``, default
:class:`ReadWindow`: 512 messages, 1 MiB), each batch being everything delivered since the
previous one. A caller that stops iterating stops pulling: nothing beyond the window waits for
it, in this process or on the server. A replay waiting ``idle_timeout_s`` for a message it
knows is due raises :class:`ReaderStalled` (replay translates it to ``ReplayStalled``).

What is due comes from the stream's leader: the consumer lives on one replica of the stream,
any of them, and counts only what that replica holds. Right after a node restart its replica
may still be catching up, and a count taken there ended a replay short ("retained 23 of 28
chunks"). A read from the start therefore asks the leader (stream info with the session's
filter, answered by the leader only) how many of the session's chunks it holds, and waits for
the consumer to deliver that many: a lagging replica delivers the rest as it catches up, and
one that does not within ``idle_timeout_s`` ends the read with :class:`ReaderStalled`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator

from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js.errors import Error as JsError

from tokenwire.broker._api import server_url
from tokenwire.broker._bounded import BoundedRead, ReadWindow
from tokenwire.broker._errors import BrokerUnavailable, ReaderStalled, TopologyError
from tokenwire.broker._layout import locate_session
from tokenwire.broker._topology import Topology, stored_subject

READ_MAX_BATCH = ReadWindow().messages
"""The most messages one batch holds (the default window: a batch is what it delivered)."""
READ_IDLE_TIMEOUT_S = 10.0


RawChunk = tuple[int, bytes]
"""One stored message of the session: ``(stream seq, payload)`` (a tuple: the hot path)."""


def session_read(
    nc: Client, topology: Topology, session: str, from_seq: int | None, window: ReadWindow | None
) -> BoundedRead:
    """The bounded read of one session's stored chunks (the one place that names the stream
    and the filter a session is read from): ``topology`` is the layout that holds the session
    (:func:`located`)."""
    return BoundedRead(
        nc,
        topology.stream_of(session),
        topology.session_filter(session),
        from_seq or 1,
        window=window,
    )


async def located(nc: Client, topology: Topology, session: str) -> Topology:
    """The layout holding the session: its stream under ``topology``
    (``topology.stream_of``), or a retired layout's stream that still holds it when the
    current one does not (after ``tokenwire reshard``, ``locate_session``)."""
    try:
        return await locate_session(nc, topology, session)
    except TopologyError as exc:
        raise BrokerUnavailable(server_url(nc), f"cannot locate {session}: {exc}") from exc


async def session_batches(
    nc: Client,
    topology: Topology,
    session: str,
    from_seq: int | None = None,
    *,
    follow: bool = False,
    window: ReadWindow | None = None,
    idle_timeout_s: float = READ_IDLE_TIMEOUT_S,
) -> AsyncGenerator[list[RawChunk], None]:
    """Yield the session's stored chunks from ``from_seq`` (inclusive) in stream order, in
    batches of at most ``window.messages``. Without ``follow`` it stops once caught up (what
    is due is fixed when the read starts); with ``follow`` it waits for new chunks until the
    caller stops iterating. The session is read where it is (:func:`located`)."""
    topology = await located(nc, topology, session)
    read = session_read(nc, topology, session, from_seq, window)
    try:
        local = await read.open()
        if not follow:
            read.limit = await _due(nc, topology, session, local, from_seq)
        while read.limit is None or read.limit > 0:
            batch = await read.take(idle_timeout_s if read.limit is not None else None)
            if not batch:
                raise ReaderStalled(session, idle_timeout_s, read.last_seq)
            yield [(d[0], d[1]) for d in batch]
    finally:
        await read.close()


async def _due(
    nc: Client, topology: Topology, session: str, local: int, from_seq: int | None
) -> int:
    """How many messages the read must deliver: what the consumer counted when it was created
    and, for a read from the start, at least what the stream's leader holds of the session
    then (see the module; a read from a later seq keeps the consumer's count)."""
    if from_seq is not None and from_seq > 1:
        return local
    try:
        return max(local, await _leader_count(nc, topology, session))
    except (TimeoutError, JsError, NatsError) as exc:
        raise BrokerUnavailable(server_url(nc), f"cannot count {session}: {exc}") from exc


async def _leader_count(nc: Client, topology: Topology, session: str) -> int:
    """The session's chunks in the stream, as its leader holds them (stream info is answered
    by the leader, never by a follower)."""
    stream_name, subjects = topology.stream_of(session), topology.session_filter(session)
    stream = await nc.jetstream().stream_info(stream_name, subjects)
    return sum((stream.state.subjects or {}).values())


async def first_chunks(
    nc: Client, topology: Topology, session: str, *, idle_timeout_s: float = READ_IDLE_TIMEOUT_S
) -> list[RawChunk]:
    """The session's retained first chunks (ordinal 0 of each step, on its ``.first``
    subject), in stream order: one small message per retained step, read with the same bound
    (what the consumer holds when it is created; :class:`ReaderStalled` past
    ``idle_timeout_s`` without a delivery)."""
    topology = await located(nc, topology, session)
    subject = stored_subject(topology, session, first=True)
    read = BoundedRead(nc, topology.stream_of(session), subject, 1)
    out: list[RawChunk] = []
    try:
        read.limit = await read.open()
        while read.limit > 0:
            batch = await read.take(idle_timeout_s)
            if not batch:
                raise ReaderStalled(session, idle_timeout_s, read.last_seq)
            out.extend((d[0], d[1]) for d in batch)
    finally:
        await read.close()
    return out
