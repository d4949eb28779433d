"""``read_session``: a session's retained chunks as replay events; ``paced``: original timing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

import msgspec

from tokenwire.broker import Connection, ReadWindow, Topology, valid_session
from tokenwire.replay._errors import InvalidSessionId, UndecodableChunk
from tokenwire.replay._events import ReplayEvent
from tokenwire.replay._render import SessionRenderer
from tokenwire.replay._source import DEFAULT_IDLE_TIMEOUT_S, stored_chunks
from tokenwire.schemas import chunk_envelopes

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

    ::

        async for event in read_session(nc, Topology(), "s-42"):
            print(event.seq, event.shown)
    """
    if not valid_session(session):
        raise InvalidSessionId(session)  # now, not at the first iteration
    return rendered(
        nc,
        topology,
        session,
        renderer=SessionRenderer(),
        read_from=(1, 0),
        emit_from=(from_seq or 1, from_index),
        follow=follow,
        idle_timeout_s=idle_timeout_s,
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
) -> AsyncGenerator[ReplayEvent, None]:
    """Read from the position ``read_from`` (stream seq, chunk index in that message), render
    every chunk from there with ``renderer`` (exactly once, in stream order), yield the events
    from the position ``emit_from`` on. A caller that stops early and reads on later with the
    same renderer continues from the last event's :attr:`~ReplayEvent.next_position`.
    ``window`` bounds the broker read (``broker.ReadWindow``; its default when None)."""
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
                    shown = render(envelope)
                    if seq > emit_seq or (seq == emit_seq and index >= emit_index):
                        yield ReplayEvent(seq, envelope, shown, 0, index, index == last)
    finally:
        await batches.aclose()


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
