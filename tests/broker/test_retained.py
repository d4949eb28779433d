"""retained_sessions on a real stream: every session, past the server's 100,000-subject page."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from nats.aio.client import Client

from tokenwire.broker import Topology, TopologyError, chunk_subject, retained_sessions

PAGE = 100_000  # nats-server's JSMaxSubjectDetails: subjects per STREAM.INFO answer
T = TypeVar("T")


async def settled(read: Callable[[], Awaitable[T]], expected: T, timeout_s: float) -> T:
    """Read until the value is ``expected`` or ``timeout_s`` passed; the last value read."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    value = await read()
    while value != expected and loop.time() < deadline:
        await asyncio.sleep(0.05)
        value = await read()
    return value


async def publish_firsts(nc: Client, t: Topology, sessions: list[str]) -> None:
    """One ``first`` chunk per session (core publishes), then wait until all are stored."""
    for session in sessions:
        await nc.publish(chunk_subject(t, session, first=True), b"{}")
    await nc.flush()
    js = nc.jetstream()

    async def stored() -> int:
        return int((await js.stream_info(t.stream)).state.messages)

    assert await settled(stored, len(sessions), 60) == len(sessions)


async def test_every_session_with_a_chunk_is_listed(nc: Client, topology: Topology) -> None:
    await publish_firsts(nc, topology, ["a", "b-1", "c_2"])
    await nc.publish(chunk_subject(topology, "only-next", first=False), b"{}")
    await nc.publish(chunk_subject(topology, "a", first=False), b"{}")
    await nc.flush()
    want = {"a", "b-1", "c_2", "only-next"}
    assert await settled(lambda: retained_sessions(nc, topology), want, 10) == want


async def test_an_empty_stream_has_no_sessions(nc: Client, topology: Topology) -> None:
    assert await retained_sessions(nc, topology) == set()


async def test_a_missing_stream_is_a_topology_error(nc: Client, topology: Topology) -> None:
    missing = Topology(prefix=topology.prefix, stream="NO_SUCH_STREAM")
    with pytest.raises(TopologyError, match="NO_SUCH_STREAM"):
        await retained_sessions(nc, missing)


@pytest.mark.slow
async def test_sessions_past_the_first_page_of_subjects_are_listed(
    nc: Client, topology: Topology
) -> None:
    """nats-py's stream_info reads only the first page: the bug this replaced."""
    sessions = [f"s{i}" for i in range(PAGE + 500)]
    await publish_firsts(nc, topology, sessions)
    first_page = await nc.jetstream().stream_info(
        topology.stream, subjects_filter=f"{topology.prefix}.chunks.>"
    )
    assert len(first_page.state.subjects or {}) == PAGE
    assert await retained_sessions(nc, topology) == set(sessions)
