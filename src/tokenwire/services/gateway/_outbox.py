"""The bounded byte buffer between a step (reading the provider) and its caller's response.

The step appends; the response takes everything buffered at once, so writes coalesce while
the caller is busy. Once the response has started it attaches its writer, and data that
finds nothing buffered and no write in progress is written by the step itself: one task
step per provider read fewer (bench/bench_gateway.py (d): most reads bring one event, and
each task step waits behind every other ready callback).

Bounds: when more than ``limit`` bytes wait, the step waits too (a slow caller slows the
provider read, as if it had called the provider directly); a write the step makes itself
waits in the server's flow control when the caller's socket is full (so the step may wait
with less than ``limit`` held). Before the response has started nothing waits for room: the
first read's bytes are taken whatever their size (bounded by the provider client's read
buffer), since only the task putting them would start the response. When the caller leaves,
:meth:`Outbox.detach` drops the buffer and every later write, so the step reads on at full
speed and the durable log stays complete; a writer that raises (a server reporting a gone
caller so, as the ASGI spec allows) counts as the caller leaving, through ``on_error``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

Writer = Callable[[bytes], Awaitable[None]]


class Outbox:
    """A single-producer, single-consumer byte buffer with back-pressure."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buffer = bytearray()
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._closed = False
        self._detached = False
        self._writer: Writer | None = None
        self._on_error: Callable[[], None] = lambda: None
        self._writing = False

    @property
    def detached(self) -> bool:
        """Whether the caller is gone."""
        return self._detached

    def attach(self, writer: Writer, on_error: Callable[[], None]) -> None:
        """The response has started: ``put`` may write through ``writer`` itself;
        ``on_error`` runs (after the outbox is detached) if ``writer`` raises."""
        self._writer = writer
        self._on_error = on_error

    async def put(self, data: bytes) -> None:
        """Append ``data`` (or write it, see the module docstring); waits while more than
        ``limit`` bytes wait for the caller."""
        if self._detached or not data:
            return
        if self._writer is not None and not self._writing and not self._buffer:
            await self.write(data)
            return
        self._buffer += data
        self._ready.set()
        if len(self._buffer) > self._limit and self._writer is not None:
            self._room.clear()
            await self._room.wait()

    def close(self) -> None:
        """No more data: :meth:`get` returns ``None`` once the buffer is drained."""
        self._closed = True
        self._ready.set()

    def detach(self) -> None:
        """The caller left: drop what waits and release a waiting producer and reader."""
        self._detached = True
        self._buffer.clear()
        self._room.set()
        self._ready.set()

    async def write(self, data: bytes) -> None:
        """Write ``data`` through the attached writer, marked as the write in progress."""
        assert self._writer is not None  # attached
        self._writing = True
        try:
            await self._writer(data)
        except asyncio.CancelledError:
            if not self._detached:  # not written: the reader sends it, before the end
                self._buffer[:0] = data
            raise
        except Exception:
            self.detach()
            self._on_error()
        finally:
            self._writing = False
            if self._buffer:
                self._ready.set()

    async def get(self) -> bytes | None:
        """Everything buffered (waiting for some), or ``None`` at the end or once detached."""
        while not self._buffer or self._writing:
            if (self._closed and not self._buffer) or self._detached:
                return None
            self._ready.clear()
            await self._ready.wait()
        data = bytes(self._buffer)
        self._buffer.clear()
        self._room.set()
        return data
