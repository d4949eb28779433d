"""The step watchdog cancels only a step waiting for its provider (unit, real event loop)."""

from __future__ import annotations

import asyncio

import pytest

from tokenwire.services.gateway._steps.watchdog import Watchdog


async def test_expiry_while_publishing_is_noted_not_cancelled() -> None:
    expired = asyncio.Event()
    task = asyncio.current_task()
    assert task is not None
    dog = Watchdog(task, max_s=60, idle_s=0.01)
    dog.reading = False  # "publishing"
    loop = asyncio.get_running_loop()
    loop.call_at(dog._due() + 0.001, expired.set)  # right after the watchdog's own timer
    await asyncio.wait_for(expired.wait(), 5)
    assert dog.overdue() is not None
    assert "max_step_idle_seconds" in (dog.overdue() or "")
    assert not dog.fired
    dog.stop()


async def test_expiry_while_reading_cancels_the_watched_task() -> None:
    never = asyncio.get_running_loop().create_future()

    async def read() -> None:
        await never

    task = asyncio.create_task(read())
    dog = Watchdog(task, max_s=0.01, idle_s=60)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert dog.fired
    assert "max_step_seconds" in (dog.overdue() or "")
    dog.stop()
