"""A step's chunks into broker messages: frames (schema version 2, ADR 0024).

A frame is one broker message carrying consecutive chunks of one step. The step hands every
chunk to its :class:`Framer` as it publishes today; the framer decides when a frame goes:

- the step's first chunk (ordinal 0) goes alone and at once (``.first``: telemetry and the
  time to first chunk see it exactly as before);
- a finish goes at once, with whatever the frame held before it;
- a chunk that would take the frame past the broker's message size (headers counted) or past
  :data:`FRAME_TARGET_BYTES` sends the frame first and opens the next;
- at the end of each provider read the frame goes (``linger_s`` 0), or, with a linger, once
  the frame is ``linger_s`` old: at the next read after that, else by a timer. The caller's
  own stream never waits for this: the step feeds the caller after each read as before; only
  the broker publish waits;
- before the step waits for its acks (the end of every step, any way it ends), everything
  held is sent (:meth:`Framer.flush`), so the caller's stream still ends only after every
  chunk of the step is acknowledged.

With frames off (:attr:`FramePolicy.frames` false) the step publishes every chunk as its own
version-1 envelope, as before frames (a rolling upgrade: readers first, then frames on).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tokenwire.schemas import FRAME_TAIL, StreamChunk, frame_item
from tokenwire.variables import FRAME_LINGER_MS, FRAMES, MAX_LINGER_MS

DEFAULT_LINGER_MS = FRAME_LINGER_MS.value
"""The default linger (docs/adr/0024-chunk-frames.md: the measurement that chose it)."""
FRAME_TARGET_BYTES = 64 * 1024
"""A frame stops growing past this many payload bytes (a single larger chunk still goes
alone, up to the broker's ``max_payload``): consumers pull in batches of messages, not bytes,
so a message's size bounds what they hold (512 x 64 KiB = 32 MiB per assembler partition)."""


@dataclass(frozen=True)
class FramePolicy:
    """How a step's chunks become broker messages (``TOKENWIRE_FRAMES``,
    ``TOKENWIRE_FRAME_LINGER_MS``)."""

    frames: bool = FRAMES.value
    linger_ms: int = DEFAULT_LINGER_MS

    def __post_init__(self) -> None:
        if not 0 <= self.linger_ms <= MAX_LINGER_MS:
            raise ValueError(f"linger_ms must be 0 to {MAX_LINGER_MS}, got {self.linger_ms}")


class ChunkTooLargeForFrame(Exception):  # noqa: N818 - a condition, like PayloadTooLarge
    """The chunk does not fit in a frame of its own: the step fits it (``_steps/fit.py``) first."""


class _Frame:
    __slots__ = ("head", "items", "limit", "opened", "ordinal", "size", "time_ns")

    def __init__(self, head: bytes, ordinal: int, time_ns: int, limit: int, opened: float):
        self.head = head
        self.ordinal = ordinal
        self.time_ns = time_ns
        self.limit = limit  # payload bytes the broker takes beside this frame's headers
        self.opened = opened
        self.items: list[bytes] = []
        self.size = len(head) + len(FRAME_TAIL) - 1  # each item adds its length and a comma

    def payload(self) -> bytes:
        return self.head + b",".join(self.items) + FRAME_TAIL


Head = Callable[[int, int], tuple[bytes, int]]
"""``(ordinal, time_ns) -> (frame head, payload limit)`` of a frame opening at ``ordinal``."""
Send = Callable[[bytes, int], Awaitable[None]]
"""Publishes one frame's payload; ``ordinal`` is its first chunk's."""


class Framer:
    """The open frame of one step, and when it goes (see the module docstring).

    ``head`` builds a frame's head and tells its payload limit; ``send`` publishes a frame
    (and raises the step's :class:`GatewayError` when the broker fails it). Only the step's
    own task adds chunks; a linger timer may send the open frame from a task of its own, which
    :meth:`flush` waits for first, so frames go out in ordinal order.
    """

    def __init__(self, linger_s: float, head: Head, send: Send) -> None:
        self._linger = linger_s
        self._head = head
        self._send = send
        self._frame: _Frame | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        self.frames = 0  # sent, for the step's figures

    @property
    def holding(self) -> bool:
        """Whether chunks wait in the open frame."""
        return self._frame is not None

    async def add(self, chunk: StreamChunk, ordinal: int, time_ns: int) -> None:
        """Append ``chunk`` as ``ordinal``; the frame goes first when it would not fit. Raises
        :class:`ChunkTooLargeForFrame` (nothing held changed) when it fits in no frame."""
        if not self.append(chunk, ordinal, time_ns):
            await self.flush()
            self._open(chunk, ordinal, time_ns)

    def append(self, chunk: StreamChunk, ordinal: int, time_ns: int) -> bool:
        """:meth:`add` without waiting: ``chunk`` joins the open frame (or opens one) and True;
        False, nothing changed, when the open frame is too full for it (:meth:`add` sends the
        frame first). Raises :class:`ChunkTooLargeForFrame` as :meth:`add` does."""
        frame = self._frame
        if frame is None:
            self._open(chunk, ordinal, time_ns)
            return True
        item = frame_item(time_ns - frame.time_ns, chunk)
        grown = frame.size + 1 + len(item)
        if grown > frame.limit or grown > FRAME_TARGET_BYTES:
            return False
        frame.items.append(item)
        frame.size = grown
        return True

    def _open(self, chunk: StreamChunk, ordinal: int, time_ns: int) -> None:
        head, limit = self._head(ordinal, time_ns)
        frame = _Frame(head, ordinal, time_ns, limit, self._loop.time())
        item = frame_item(0, chunk)
        if frame.size + 1 + len(item) > limit:
            raise ChunkTooLargeForFrame(f"{frame.size + 1 + len(item)} > {limit} bytes")
        frame.items.append(item)
        frame.size += 1 + len(item)
        self._frame = frame

    def fits_alone(self, chunk: StreamChunk, ordinal: int, time_ns: int, margin: int) -> bool:
        """Whether ``chunk`` fits in a frame of its own opening at ``ordinal`` with ``margin``
        bytes to spare (for what grows with a later ordinal)."""
        head, limit = self._head(ordinal, time_ns)
        return len(head) + len(FRAME_TAIL) + len(frame_item(0, chunk)) + margin <= limit

    def read_done(self) -> bool:
        """A provider read was taken: whether the frame is due (the step then awaits
        :meth:`flush`), else let it linger (a timer sends it when no read comes in time).
        Not a coroutine: most reads leave the frame lingering, and a coroutine per read
        cost a frame to create and run for nothing."""
        frame = self._frame
        if frame is None:
            return False
        if self._linger <= 0 or self._loop.time() - frame.opened >= self._linger:
            return True
        if self._timer is None:
            self._timer = self._loop.call_at(frame.opened + self._linger, self._lingered)
        return False

    async def flush(self) -> None:
        """Send everything held, after any linger send in progress (raises its error). A
        timer may start another linger send while this one waits: it is waited for too, so
        nothing taken before the flush is left unsent when it returns."""
        while self._task is not None:
            task, self._task = self._task, None
            await asyncio.shield(task)
        await self._send_open()

    def close(self) -> None:
        """The step ended: no timer fires for it any more (what is held was sent by the
        step's last flush, or the broker failed the step)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _lingered(self) -> None:
        self._timer = None
        if self._frame is None:
            return  # sent meanwhile
        if self._task is not None:  # the previous frame is still on its way: look again
            self._timer = self._loop.call_later(self._linger, self._lingered)
            return
        task = self._loop.create_task(self._send_open())
        task.add_done_callback(_retrieved)
        self._task = task

    async def _send_open(self) -> None:
        frame = self._frame
        if frame is None:
            return
        self._frame = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.frames += 1
        await self._send(frame.payload(), frame.ordinal)


def _retrieved(task: asyncio.Task[None]) -> None:
    """Mark a linger send's error as seen: the step raises it at its next flush."""
    if not task.cancelled():
        task.exception()
