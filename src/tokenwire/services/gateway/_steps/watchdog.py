"""The time bounds of one step: ``max_step_seconds`` in all and ``max_step_idle_seconds``
without a chunk, enforced without a timer per provider read.

One timer per step. When it fires past the bound, the step's task is cancelled only while it
waits for the provider (:attr:`Watchdog.reading`); while it publishes, the expiry is only
noted and the step checks :attr:`Watchdog.expired` after the chunks it holds are taken, so a
cancellation never lands inside a publish (where a chunk may be on the wire before its ordinal
is counted, and the next message would reuse its ``Nats-Msg-Id``).
"""

from __future__ import annotations

import asyncio


class Watchdog:
    """Watches one step's task; see the module docstring."""

    def __init__(self, task: asyncio.Task[object], max_s: float, idle_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = task
        self._end = self._loop.time() + max_s
        self._max_s = max_s
        self._idle_s = idle_s
        self._last_chunk = self._loop.time()
        self.reading = True
        self.expired: str | None = None
        self.fired = False
        self._timer = self._loop.call_at(self._due(), self._check)

    def watch(self, task: asyncio.Task[object]) -> None:
        """Watch ``task`` from now on (the step's first read and its rest run in two tasks)."""
        self._task = task

    def chunk_seen(self) -> None:
        """A read brought a chunk: the idle bound restarts (the timer moves when it fires)."""
        self._last_chunk = self._loop.time()

    def overdue(self) -> str | None:
        """The bound that ran out while the step was not reading, if one did."""
        return self.expired

    def stop(self) -> None:
        """The step is over; nothing more is watched."""
        self._timer.cancel()

    def _due(self) -> float:
        return min(self._end, self._last_chunk + self._idle_s)

    def _check(self) -> None:
        now = self._loop.time()
        if now < self._due():
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
