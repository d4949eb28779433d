"""The bounded byte buffer between a step (reading the provider) and its caller's response.

The step appends; the response takes everything buffered at once, so writes coalesce while
the caller is busy. Bounds: when more than ``limit`` bytes wait, the step waits too (a slow
caller slows the provider read, as if it had called the provider directly). When the caller
leaves, :meth:`detach` drops the buffer and every later write, so the step reads on at full
speed and the durable log stays complete.
"""

from __future__ import annotations

import asyncio


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

    @property
    def detached(self) -> bool:
        """Whether the caller is gone."""
        return self._detached

    async def put(self, data: bytes) -> None:
        """Append ``data``; waits while more than ``limit`` bytes wait for the caller."""
        if self._detached or not data:
            return
        self._buffer += data
        self._ready.set()
        if len(self._buffer) > self._limit:
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

    async def get(self) -> bytes | None:
        """Everything buffered (waiting for some), or ``None`` at the end or once detached."""
        while not self._buffer:
            if self._closed or self._detached:
                return None
            self._ready.clear()
            await self._ready.wait()
        data = bytes(self._buffer)
        self._buffer.clear()
        self._room.set()
        return data
