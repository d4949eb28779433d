"""The time bounds of one step: ``max_step_seconds`` in all and ``max_step_idle_seconds``
without a chunk, enforced without a timer per provider read.

One timer per step. When it fires past the bound, the step's task is cancelled only while it
waits for the provider (:attr:`Watchdog.reading`); while it publishes, the expiry is only
noted and the step checks :attr:`Watchdog.expired` after the chunks it holds are taken, so a
cancellation never lands inside a publish (where a chunk may be on the wire before its ordinal
is counted, and the next message would reuse its ``Nats-Msg-Id``).

A routed call's first-byte bound (:meth:`Watchdog.first_byte_within`) rides on the same timer:
past it, before any chunk, the reading task is cancelled with
:attr:`Watchdog.first_byte_overdue` set (the step then tries its next deployment), and the
other bounds go on being watched.
"""

from __future__ import annotations

import asyncio
import math


class Watchdog:
    """Watches one step's task; see the module docstring."""

    def __init__(
        self,
        task: asyncio.Task[object],
        max_s: float,
        idle_s: float,
        first_byte_s: float | None = None,
    ) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = task
        self._end = self._loop.time() + max_s
        self._max_s = max_s
        self._idle_s = idle_s
        self._last_chunk = self._loop.time()
        self._first_byte = math.inf if first_byte_s is None else self._last_chunk + first_byte_s
        self.reading = True
        self.expired: str | None = None
        self.fired = False
        self.first_byte_overdue = False
        self._timer = self._loop.call_at(self._due(), self._check)

    def first_byte_within(self, seconds: float | None) -> None:
        """The next call's first-byte bound (None: none), from now."""
        self._first_byte = math.inf if seconds is None else self._loop.time() + seconds
        if self._first_byte < self._timer.when():
            self._timer.cancel()
            self._timer = self._loop.call_at(self._due(), self._check)

    def watch(self, task: asyncio.Task[object]) -> None:
        """Watch ``task`` from now on (the step's first read and its rest run in two tasks)."""
        self._task = task

    def chunk_seen(self) -> None:
        """A read brought a chunk: the idle bound restarts (the timer moves when it fires),
        and a first-byte bound is met."""
        self._last_chunk = self._loop.time()
        self._first_byte = math.inf

    def overdue(self) -> str | None:
        """The bound that ran out while the step was not reading, if one did."""
        return self.expired

    def stop(self) -> None:
        """The step is over; nothing more is watched."""
        self._timer.cancel()

    def _due(self) -> float:
        return min(self._end, self._last_chunk + self._idle_s, self._first_byte)

    def _check(self) -> None:
        now = self._loop.time()
        if now < self._due():
            self._timer = self._loop.call_at(self._due(), self._check)
            return
        if now >= self._first_byte and now < min(self._end, self._last_chunk + self._idle_s):
            self._first_byte = math.inf
            if self.reading:
                self.first_byte_overdue = True
                self._task.cancel()
            self._timer = self._loop.call_at(self._due(), self._check)
            return
        if now >= self._end:
            self.expired = f"the step exceeded max_step_seconds ({self._max_s:g} s)"
        else:
            self.expired = (
                f"the step exceeded max_step_idle_seconds ({self._idle_s:g} s without a chunk)"
            )
        if self.reading:
            self.fired = True
            self._task.cancel()
