"""An events response whose broker read ends on an error nobody expected ends with an
``event: error`` (the read's task gone, the response idled with keepalives for ever)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tokenwire.broker import Topology
from tokenwire.replay import SseStats, _sse
from tokenwire.replay._events import ReplayEvent

BOUND_S = 5.0


async def _failing_read(*args: Any, **kwargs: Any) -> AsyncIterator[ReplayEvent]:
    raise ValueError("a decode nobody guarded")
    yield  # an async generator, like the real read


async def test_a_read_that_fails_unexpectedly_ends_the_response_with_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_sse, "rendered", _failing_read)
    policy = _sse.SlowReaderPolicy(keepalive_s=0.01)
    body = _sse.stream(
        None,  # type: ignore[arg-type]  # the read is replaced
        Topology(),
        "s1",
        start=(0, 0),
        follow=False,
        policy=policy,
        stats=SseStats(),
    )

    async def frames() -> list[bytes]:
        return [frame async for frame in body]

    got = await asyncio.wait_for(frames(), BOUND_S)

    assert got[-1].startswith(b"event: error\n")
    assert b"the read failed: ValueError" in got[-1]
    assert b"a decode nobody guarded" not in b"".join(got)
