"""A session past the broker's retention: the steps it no longer retains whole, from the store.

Retention drops a stream's oldest messages first, so what the broker still holds of a session
is its tail. A stored step whose first chunk (ordinal 0, on the ``.first`` subject) is not
retained began before that tail: it is served whole from the store's chunk log, with its
original timing, as events marked ``source="store"``; the broker serves the rest, leaving out
the chunks it still holds of those steps. So a session partly retained reads seamlessly, and
one wholly gone reads from the store alone. The store's part has the positions ``(0, k)``
(``k`` the store's per-session seq, event id ``0:k``): before every broker position.
docs/replay.md, "Past retention".
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import msgspec

from tokenwire.broker import Connection, Topology, first_chunks
from tokenwire.schemas import ChunkEnvelope, ChunkEvent, chunk_envelopes
from tokenwire.store import Store, StoreError

STORE_PAGE = 4096
"""Store seqs read at once (a page of the chunk log in memory at most)."""


@dataclass(frozen=True, slots=True)
class StoredPart:
    """The steps served from the store: ``gone`` (turn, step), at the store seq ranges
    ``ranges`` (inclusive, in seq order)."""

    gone: frozenset[tuple[int, int]] = frozenset()
    ranges: tuple[tuple[int, int], ...] = ()


class History:
    """The store a replay reads the steps gone from the broker from; :meth:`part` is worked
    out once per reader (one store query, one read of the session's retained first chunks)."""

    def __init__(self, store: Store, session: str) -> None:
        self.store = store
        self.session = session
        self._part: StoredPart | None = None

    async def part(self, nc: Connection, topology: Topology) -> StoredPart:
        """The steps the broker no longer retains whole (none without stored chunks; a store
        that does not answer serves nothing: the broker alone, as without a store)."""
        if self._part is None:
            self._part = await _stored_part(self.store, nc, topology, self.session)
        return self._part

    async def envelopes(
        self, part: StoredPart, from_seq: int
    ) -> AsyncIterator[tuple[int, ChunkEnvelope]]:
        """``(store seq, envelope)`` of the part's chunks from ``from_seq`` on, a page at a
        time."""
        for low, high in part.ranges:
            start = max(low, from_seq)
            while start <= high:
                end = min(high, start + STORE_PAGE - 1)
                for event in await self.store.session_events(self.session, start, end):
                    if isinstance(event, ChunkEvent):
                        yield event.seq, event.envelope
                start = end + 1


async def _stored_part(store: Store, nc: Connection, t: Topology, session: str) -> StoredPart:
    try:
        outcomes = await store.messages(session)
    except StoreError:
        return StoredPart()
    stored = [o for o in outcomes if o.seq_end >= o.seq_start]
    if not stored:
        return StoredPart()
    retained: set[tuple[int, int]] = set()
    for _, payload in await first_chunks(nc, t, session):
        try:
            retained.update((e.turn, e.step) for e in chunk_envelopes(payload))
        except msgspec.MsgspecError:
            continue  # not a chunk: it names no step
    gone = [o for o in stored if (o.turn, o.step) not in retained]
    return StoredPart(
        frozenset((o.turn, o.step) for o in gone), tuple((o.seq_start, o.seq_end) for o in gone)
    )
