"""``SessionReader``: an ordered read of one session from the chunk stream, a chunk at a time.

It reads ``<prefix>.chunks.<p>.<session>.*`` with the same bounded pull read as replay
(:mod:`._bounded`: an ephemeral pull consumer, at most a window of messages in flight,
recreated from the next sequence on a gap), from a stream sequence or from the beginning, and
yields each message with its subject and headers. ``replay()`` stops once caught up;
``tail()`` follows live until the caller stops iterating.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from nats.aio.client import Client

from tokenwire.broker._batches import located, session_read
from tokenwire.broker._bounded import BoundedRead, Delivery, ReadWindow
from tokenwire.broker._errors import ReaderStalled
from tokenwire.broker._replies import header_fields
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
            envelopes = chunk_envelopes(chunk.payload)  # one, or a frame's

    ``idle_timeout_s`` bounds how long a replay waits for a message it knows is due
    (ReaderStalled past it); ``window`` bounds what is in flight (:class:`ReadWindow`);
    ``poll_s`` is kept for callers of earlier versions (a tail now waits on its pulls).
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
        window: ReadWindow | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nc = nc
        self._topology = topology
        self._session = session
        self._from_seq = from_seq
        self._idle_timeout = idle_timeout_s
        self._poll = poll_s
        self._window = window
        self._clock = clock

    async def _read(self) -> BoundedRead:
        """The bounded read, on the layout that holds the session (a retired one after
        ``tokenwire reshard``)."""
        topology = await located(self._nc, self._topology, self._session)
        return session_read(self._nc, topology, self._session, self._from_seq, self._window)

    async def replay(self) -> AsyncIterator[StoredChunk]:
        """Yield the session's stored chunks in stream order, then stop (caught up).

        What is caught up is fixed when the read starts: chunks appended while replaying are
        not included.
        """
        read = await self._read()
        try:
            read.limit = await read.open()
            while read.limit > 0:
                batch = await read.take(self._idle_timeout)
                if not batch:
                    raise ReaderStalled(self._session, self._idle_timeout, read.last_seq)
                for delivery in batch:
                    yield _to_chunk(delivery)
        finally:
            await read.close()

    async def tail(self) -> AsyncIterator[StoredChunk]:
        """Yield stored chunks from the start position, then live ones, until closed."""
        read = await self._read()
        try:
            await read.open()
            while True:
                for delivery in await read.take(None):
                    yield _to_chunk(delivery)
        finally:
            await read.close()


def _to_chunk(delivery: Delivery) -> StoredChunk:
    seq, payload, subject, headers, pending = delivery
    return StoredChunk(seq, subject.decode(), header_fields(headers), payload, pending)
