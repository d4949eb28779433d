"""The session events as server-sent events, with a slow-reader policy that never blocks.

Each client gets its own bounded read of the broker (``read_window`` in flight at most) and a
bounded queue before its HTTP response. The read never waits on the client while it is open:

1. while the queue has room, every event is queued as is;
2. when it is full (``queue_bound`` events or ``queue_bytes`` of frames), an event that shows
   nothing (block-start, tool-call fragments, usage) is folded into the last queued event,
   and a text or reasoning fragment of the same block is appended to the last queued
   fragment (up to ``max_coalesced_bytes``): the rendered view stays exact, the event's
   ``id`` advances to the newest event's, ``coalesced`` counts the events it stands for;
3. when nothing can be merged, the read pauses (its consumer deleted: nothing on the broker
   waits for this client) up to ``max_pause_s`` for the queue to drain to half, then reads
   on from the next position, with its rendering state kept;
4. a client that did not drain in time gets what was queued, then ``event: lagged`` with the
   id to resume from, and the response ends; an EventSource reconnects by itself with
   ``Last-Event-ID`` = that id: nothing missed, nothing repeated.

The queue holds encoded frames (counted in bytes) and only its last event as an object, the
one a later event may merge into (merged text counted by :func:`text_bytes`).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import msgspec

from tokenwire.broker import BrokerError, Connection, ReadWindow, Topology, cancel_task
from tokenwire.replay._errors import ReplayError, UndecodableChunk
from tokenwire.replay._events import ReplayEvent, ShownReasoning, ShownText
from tokenwire.replay._history import History
from tokenwire.replay._read import rendered
from tokenwire.replay._render import SessionRenderer
from tokenwire.schemas import ReasoningDelta, TextDelta, json_encoder
from tokenwire.scrub import scrub
from tokenwire.store import StoreError

NcProvider = Callable[[], Connection]
"""Returns the gateway's connected NATS client (raise if there is none yet)."""

log = logging.getLogger(__name__)

Position = tuple[int, int]
"""Where a read starts: (stream seq of a message, index of a chunk in it)."""


log = logging.getLogger("tokenwire.replay")

EVENTS_READ_WINDOW = ReadWindow(messages=256, bytes=256 * 1024)
"""What one client's broker read has in flight at most (requested, not yet rendered)."""


@dataclass(frozen=True)
class SlowReaderPolicy:
    """Bounds of one SSE client. ``queue_bound`` events and ``queue_bytes`` of encoded
    frames wait at most; merged text grows to ``max_coalesced_bytes`` at most (see
    :func:`text_bytes`); a paused broker read waits ``max_pause_s`` at most for the client to
    drain half the queue before the client is lagged; a ``: keepalive`` comment goes out after
    ``keepalive_s`` idle; ``retry_ms`` is the reconnection delay the client is told;
    ``read_window`` bounds the client's broker read (messages and bytes requested from the
    server and not yet rendered)."""

    queue_bound: int = 256
    queue_bytes: int = 256 * 1024
    max_coalesced_bytes: int = 16 * 1024
    max_pause_s: float = 10.0
    keepalive_s: float = 15.0
    retry_ms: int = 1000
    read_window: ReadWindow = EVENTS_READ_WINDOW


@dataclass
class SseStats:
    """Counters across clients (for metrics and tests)."""

    clients: int = 0
    """Responses open now (each holds one broker read)."""
    refused: int = 0
    """Responses refused with 503 because ``clients`` was at the reader cap."""
    events: int = 0
    """Events sent."""
    coalesced: int = 0
    """Events merged into another one because a client was behind."""
    pauses: int = 0
    """Broker reads paused (unsubscribed) until a client drained its queue."""
    lagged: int = 0
    """Clients given up on (their response ends with ``event: lagged``)."""


class _Signal(enum.Enum):
    IDLE = "idle"
    END = "end"
    LAGGED = "lagged"


class ClientQueue:
    """The bounded queue between one client's broker read and its response.

    :meth:`offer` never waits; it returns False once the client lagged (the read stops).
    ``resume`` is the position after the last event the client will have got when the queue
    drains (where a reconnect continues). Queued events are kept as their encoded frames,
    except the last, which a later event may merge into (:func:`coalesce`).
    """

    def __init__(self, policy: SlowReaderPolicy, start: Position, stats: SseStats) -> None:
        self._frames: deque[bytes] = deque()
        self._frame_bytes = 0
        self._tail: ReplayEvent | None = None
        self._bound = policy.queue_bound
        self._byte_bound = policy.queue_bytes
        self._cap = policy.max_coalesced_bytes
        self._ready = asyncio.Event()
        self._stats = stats
        self.resume = start
        self.lagged = False
        self.ended = False
        self.error: Exception | None = None
        self._low = asyncio.Event()

    def offer(self, event: ReplayEvent) -> bool:
        """Queue or merge the event; False (nothing changed) when full and unmergeable."""
        tail = self._tail
        if tail is not None and self._full():
            merged = coalesce(tail, event, self._cap)
            if merged is None:
                return False
            self._tail = merged
            self._stats.coalesced += 1
        else:  # (no tail: nothing is queued, see take)
            if tail is not None:
                encoded = frame(tail)
                self._frames.append(encoded)
                self._frame_bytes += len(encoded)
            self._tail = event
        self.resume = event.next_position
        self._ready.set()
        return True

    def _full(self) -> bool:
        return len(self._frames) + 1 >= self._bound or self._frame_bytes >= self._byte_bound

    def _low_enough(self) -> bool:
        queued = len(self._frames) + (self._tail is not None)
        return queued <= self._bound // 2 and self._frame_bytes <= self._byte_bound // 2

    async def drained(self, timeout_s: float) -> bool:
        """Wait (bounded) until at most half the bounds is queued; whether it happened."""
        self._low = asyncio.Event()
        if self._low_enough():
            return True
        try:
            await asyncio.wait_for(self._low.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    def lag(self) -> None:
        """The client fell behind for good: after what is queued it gets ``lagged``."""
        self.lagged = True
        self.end()

    def end(self, error: Exception | None = None) -> None:
        """No more events will come (caught up, lagged, or the read failed)."""
        self.ended = True
        self.error = error
        self._ready.set()

    async def take(self, timeout_s: float) -> bytes | _Signal:
        """The next event's frame, or END/LAGGED once drained, or IDLE after ``timeout_s``."""
        if not self._frames and self._tail is None and not self.ended:
            self._ready.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), timeout_s)
        if self._frames:
            item = self._frames.popleft()
            self._frame_bytes -= len(item)
        elif self._tail is not None:
            item, self._tail = frame(self._tail), None
        elif self.ended:
            return _Signal.LAGGED if self.lagged else _Signal.END
        else:
            return _Signal.IDLE
        if self._low_enough():
            self._low.set()
        return item


def text_bytes(*texts: str) -> int:
    """What ``texts`` joined may cost, in bytes: their length if all are ASCII, else 4 bytes a
    character (the most a character takes in UTF-8, and in CPython's memory, where one
    character beyond the BMP makes the whole string 4 bytes a character). O(1) a text."""
    chars = sum(len(text) for text in texts)
    return chars if all(text.isascii() for text in texts) else 4 * chars


def coalesce(last: ReplayEvent, new: ReplayEvent, max_bytes: int) -> ReplayEvent | None:
    """``last`` and ``new`` as one event showing the same, or None if they cannot merge (the
    merged text would cost more than ``max_bytes``: :func:`text_bytes`)."""
    if not new.shown:
        return msgspec.structs.replace(
            last, seq=new.seq, index=new.index, last=new.last, coalesced=last.coalesced + 1
        )
    if len(last.shown) != 1 or len(new.shown) != 1 or last.step_key != new.step_key:
        return None
    a, b = last.shown[0], new.shown[0]
    if type(a) is not type(b) or not isinstance(a, ShownText | ShownReasoning):
        return None
    assert isinstance(b, ShownText | ShownReasoning)
    if a.index != b.index or text_bytes(a.text, b.text) > max_bytes:
        return None
    text = a.text + b.text
    delta = TextDelta(a.index, text) if type(a) is ShownText else ReasoningDelta(a.index, text)
    envelope = msgspec.structs.replace(new.envelope, chunk=delta)
    coalesced = last.coalesced + new.coalesced + 1
    shown = (type(a)(a.index, text),)
    return ReplayEvent(new.seq, envelope, shown, coalesced, new.index, new.last)


def frame(event: ReplayEvent) -> bytes:
    """One SSE frame: ``id`` the event's id (``seq``, or ``seq:index`` inside a frame of
    chunks), ``event: chunk``, the event as JSON."""
    body = json_encoder.encode(event)
    return b"id: %s\nevent: chunk\ndata: %s\n\n" % (event.event_id.encode(), body)


def position_ids(position: Position) -> tuple[int | str, int | str]:
    """``(last_id, from_seq)`` of a resume position, as the ``lagged`` event gives them: the
    id of the event before it and the position itself, each an integer at a message boundary
    (as before frames) and ``"seq:index"`` inside a frame."""
    seq, index = position
    if seq == 0:  # the store's part (``_history.py``): chunk ``index`` of "message 0"
        return (f"0:{index - 1}" if index > 1 else 0), f"0:{index}"
    if index == 0:
        return seq - 1, seq
    return f"{seq}:{index - 1}", f"{seq}:{index}"


def lagged_frame(position: Position) -> bytes:
    """``event: lagged``, without an id (the client's last id stays the resume point)."""
    last_id, from_seq = position_ids(position)
    body = json_encoder.encode(
        {
            "last_id": last_id,
            "from_seq": from_seq,
            "reason": "the client fell behind the server's bound; reconnect to resume",
        }
    )
    return b"event: lagged\ndata: %s\n\n" % body


def error_frame(error: Exception) -> bytes:
    """``event: error``: the broker read failed; the response ends. A broker's or store's
    error is told by its source alone (its text, which names where it lives, is logged).

    For a payload that is not a chunk the frame carries its seq as ``id`` (and in ``seq``):
    a client reconnecting with that ``Last-Event-ID`` (an EventSource does so by itself)
    continues after it, instead of meeting it again on every reconnect.
    """
    message = scrub(str(error))
    if not isinstance(error, ReplayError):  # the broker's or store's words name where it lives
        log.warning("session events: the read failed: %s", message)
        message = f"the {'store' if isinstance(error, StoreError) else 'broker'} read failed"
    if isinstance(error, UndecodableChunk):
        body = json_encoder.encode({"message": message, "seq": error.seq})
        return b"id: %d\nevent: error\ndata: %s\n\n" % (error.seq, body)
    return b"event: error\ndata: %s\n\n" % json_encoder.encode({"message": message})


async def produce(
    nc: Connection,
    topology: Topology,
    session: str,
    *,
    start: Position,
    follow: bool,
    queue: ClientQueue,
    policy: SlowReaderPolicy,
    stats: SseStats,
    history: History | None = None,
) -> None:
    """Read the broker into ``queue`` until caught up (no follow), lagged, or cancelled
    (with ``history``, the steps gone from the broker first, from the store).

    The renderer lives across pauses, so a resumed read starts at the next position without
    reading the session's beginning again.
    """
    renderer = SessionRenderer()
    read_from, emit_from = (0, 0), start
    try:
        while True:
            held = await _read_until_full(
                nc,
                topology,
                session,
                renderer=renderer,
                read_from=read_from,
                emit_from=emit_from,
                follow=follow,
                queue=queue,
                policy=policy,
                history=history,
            )
            if held is None:
                queue.end()
                return
            stats.pauses += 1
            if not await queue.drained(policy.max_pause_s):
                stats.lagged += 1
                queue.lag()
                return
            queue.offer(held)
            read_from = emit_from = held.next_position
    except (BrokerError, ReplayError, StoreError) as exc:
        queue.end(exc)
    except Exception as exc:  # ended here, the client's response would idle for ever
        log.exception("the events read of %s failed", session)
        queue.end(ReplayError(f"the read failed: {type(exc).__name__}"))


async def _read_until_full(
    nc: Connection,
    topology: Topology,
    session: str,
    *,
    renderer: SessionRenderer,
    read_from: Position,
    emit_from: Position,
    follow: bool,
    queue: ClientQueue,
    policy: SlowReaderPolicy,
    history: History | None,
) -> ReplayEvent | None:
    """Offer events until the queue refuses one (returned; the read is closed) or the end."""
    events = rendered(
        nc,
        topology,
        session,
        renderer=renderer,
        read_from=read_from,
        emit_from=emit_from,
        follow=follow,
        window=policy.read_window,
        history=history,
    )
    async with contextlib.aclosing(events):
        async for event in events:
            if not queue.offer(event):
                return event
    return None


async def stream(
    nc: Connection,
    topology: Topology,
    session: str,
    *,
    start: Position,
    follow: bool,
    policy: SlowReaderPolicy,
    stats: SseStats,
    history: History | None = None,
) -> AsyncIterator[bytes]:
    """The SSE body of one client: events from the position ``start`` (inclusive). (The caller
    counts it in ``stats.clients``: the count must hold before the body starts, for the cap.)"""
    queue = ClientQueue(policy, start, stats)
    producer = asyncio.create_task(
        produce(
            nc,
            topology,
            session,
            start=start,
            follow=follow,
            queue=queue,
            policy=policy,
            stats=stats,
            history=history,
        )
    )
    try:
        yield b"retry: %d\n\n" % policy.retry_ms
        while True:
            item = await queue.take(policy.keepalive_s)
            if isinstance(item, bytes):
                stats.events += 1
                yield item
            elif item is _Signal.IDLE:
                yield b": keepalive\n\n"
            else:
                yield _closing(item, queue)
                return
    finally:
        await cancel_task(producer)


def _closing(signal: _Signal, queue: ClientQueue) -> bytes:
    if signal is _Signal.LAGGED:
        return lagged_frame(queue.resume)
    if queue.error is not None:
        return error_frame(queue.error)
    return b": caught up\n\n"
