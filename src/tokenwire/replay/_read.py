"""``read_session``: a session's retained chunks as replay events; ``paced``: original timing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

import msgspec

from tokenwire.broker import Connection, ReadWindow, Topology, valid_session
from tokenwire.replay._errors import InvalidSessionId, UndecodableChunk
from tokenwire.replay._events import ReplayEvent
from tokenwire.replay._history import History, StoredPart
from tokenwire.replay._render import SessionRenderer
from tokenwire.replay._source import DEFAULT_IDLE_TIMEOUT_S, stored_chunks
from tokenwire.schemas import chunk_envelopes
from tokenwire.store import Store

DEFAULT_MAX_GAP_S = 5.0


def read_session(
    nc: Connection,
    topology: Topology,
    session: str,
    from_seq: int | None = None,
    *,
    follow: bool = False,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    from_index: int = 0,
    store: Store | None = None,
) -> AsyncGenerator[ReplayEvent, None]:
    """Yield one :class:`ReplayEvent` per retained chunk of ``session``, in stream order.

    ``from_seq`` is the first stream sequence to read (inclusive), ``from_index`` the first
    chunk of that message to yield (a frame carries several): after an event, reading from
    its :attr:`~ReplayEvent.next_position` continues with nothing missed or repeated. Without
    ``follow`` the read stops once caught up (as of when it started); with it, it follows
    live chunks until the caller stops iterating (``break``, or ``aclose()``). Each payload
    is decoded once. The rendering (``shown``) is exactly what a read from the start shows:
    the chunks before ``from_seq`` are read and rendered silently first (a step cut by
    ``from_seq`` needs its earlier fragments), so resuming costs a read of the session's
    earlier chunks. Raises InvalidSessionId, BrokerUnavailable,
    UndecodableChunk, ReplayStalled (a replay saw nothing for ``idle_timeout_s`` while more
    was due).

    With ``store``, the steps the broker no longer retains whole come first, from the store's
    chunk log (events with ``source="store"``, at positions ``(0, store seq)``), then the
    broker's: a read from the start (``from_seq`` None or 1) includes them, ``from_seq=0``
    with ``from_index=K`` starts at the store's chunk ``K``.

    ::

        async for event in read_session(nc, Topology(), "s-42"):
            print(event.seq, event.shown)
    """
    if not valid_session(session):
        raise InvalidSessionId(session)  # now, not at the first iteration
    history = History(store, session) if store is not None else None
    if from_seq == 0:  # the store's chunk ``from_index`` on
        emit_from = (0, from_index)
    elif from_seq is None or (from_seq, from_index) == (1, 0):  # the start
        emit_from = (0 if history is not None else 1, 0)
    else:
        emit_from = (from_seq, from_index)
    return rendered(
        nc,
        topology,
        session,
        renderer=SessionRenderer(),
        read_from=(0, 0),
        emit_from=emit_from,
        follow=follow,
        idle_timeout_s=idle_timeout_s,
        history=history,
    )


async def rendered(
    nc: Connection,
    topology: Topology,
    session: str,
    *,
    renderer: SessionRenderer,
    read_from: tuple[int, int],
    emit_from: tuple[int, int],
    follow: bool,
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S,
    window: ReadWindow | None = None,
    history: History | None = None,
) -> AsyncGenerator[ReplayEvent, None]:
    """Read from the position ``read_from`` (stream seq, chunk index in that message), render
    every chunk from there with ``renderer`` (exactly once, in stream order), yield the events
    from the position ``emit_from`` on. A caller that stops early and reads on later with the
    same renderer continues from the last event's :attr:`~ReplayEvent.next_position`.
    ``window`` bounds the broker read (``broker.ReadWindow``; its default when None).
    ``history``: the steps gone from the broker first, from the store (positions ``(0, k)``),
    their chunks still on the broker left out."""
    gone: frozenset[tuple[int, int]] = frozenset()
    if history is not None:
        part = await history.part(nc, topology)
        gone = part.gone
        if read_from < (1, 0) and emit_from < (1, 0):  # (its steps are not on the broker's)
            async for event in _from_store(history, part, renderer, read_from, emit_from):
                yield event
    skip_seq, skip_index = read_from
    emit_seq, emit_index = emit_from
    batches = stored_chunks(
        nc, topology, session, skip_seq, follow=follow, idle_timeout_s=idle_timeout_s, window=window
    )
    render = renderer.render
    try:
        async for batch in batches:
            for seq, payload in batch:
                try:
                    envelopes = chunk_envelopes(payload)
                except msgspec.MsgspecError as exc:
                    if seq < emit_seq:
                        continue  # reported to the read that met it; resuming skips it
                    raise UndecodableChunk(seq, str(exc)) from exc
                last = len(envelopes) - 1
                for index in range(skip_index if seq == skip_seq else 0, last + 1):
                    envelope = envelopes[index]
                    if gone and (envelope.turn, envelope.step) in gone:
                        continue  # shown whole from the store
                    shown = render(envelope)
                    if seq > emit_seq or (seq == emit_seq and index >= emit_index):
                        yield ReplayEvent(seq, envelope, shown, 0, index, index == last)
    finally:
        await batches.aclose()


async def _from_store(
    history: History,
    part: StoredPart,
    renderer: SessionRenderer,
    read_from: tuple[int, int],
    emit_from: tuple[int, int],
) -> AsyncGenerator[ReplayEvent, None]:
    """The store's part from the position ``read_from`` (``(0, store seq)``), rendered, the
    events from ``emit_from`` on yielded."""
    async for seq, envelope in history.envelopes(part, max(read_from[1], 1)):
        shown = renderer.render(envelope)
        if (0, seq) >= emit_from:
            yield ReplayEvent(0, envelope, shown, 0, seq, False, "store")


async def paced(
    events: AsyncIterator[ReplayEvent],
    speed: float | None = 1.0,
    *,
    max_gap_s: float = DEFAULT_MAX_GAP_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> AsyncIterator[ReplayEvent]:
    """Re-emit ``events`` with their original timing (envelope ``time_ns``) divided by
    ``speed``; ``speed=None`` is as fast as possible.

    A pause longer than ``max_gap_s`` (before scaling; e.g. hours between two turns) is
    shortened to it, and time never runs backwards (steps may interleave). The schedule is
    kept against ``clock`` so oversleeping does not accumulate.
    """
    if speed is None:
        async for event in events:
            yield event
        return
    if speed <= 0:
        raise ValueError(f"speed must be positive, got {speed}")
    start = clock()
    virtual = 0.0
    previous: int | None = None
    async for event in events:
        now_ns = event.envelope.time_ns
        if previous is not None:
            virtual += min(max(0, now_ns - previous) / 1e9, max_gap_s) / speed
        previous = now_ns if previous is None else max(previous, now_ns)
        delay = start + virtual - clock()
        if delay > 0:
            await sleep(delay)
        yield event
