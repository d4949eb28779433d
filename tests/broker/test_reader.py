"""SessionReader against the real server: from a sequence, empty sessions, live tail."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client

from tokenwire.broker import ChunkPublisher, SessionReader, Topology


async def _publish(nc: Client, topology: Topology, session: str, ordinals: range) -> None:
    publisher = await ChunkPublisher(nc, topology).start()
    for k in ordinals:
        await publisher.publish(str(k).encode(), session, 0, 0, k, first=k == 0)
    await publisher.wait_acked(session, 0, 0)
    await publisher.close()


async def test_replay_from_a_start_sequence_skips_earlier_chunks(
    nc: Client, topology: Topology
) -> None:
    await _publish(nc, topology, "other", range(5))
    await _publish(nc, topology, "mine", range(10))
    everything = [c async for c in SessionReader(nc, topology, "mine").replay()]
    assert [c.payload for c in everything] == [str(k).encode() for k in range(10)]
    start = everything[6].stream_seq
    tail = [c async for c in SessionReader(nc, topology, "mine", from_seq=start).replay()]
    assert [c.payload for c in tail] == [b"6", b"7", b"8", b"9"]
    assert [c.stream_seq for c in tail] == [c.stream_seq for c in everything[6:]]


async def test_replay_of_an_unknown_session_is_empty(nc: Client, topology: Topology) -> None:
    reader = SessionReader(nc, topology, "nobody", idle_timeout_s=1.0)
    assert [c async for c in reader.replay()] == []


async def test_tail_follows_live_chunks(nc: Client, topology: Topology) -> None:
    await _publish(nc, topology, "live", range(3))
    seen: list[bytes] = []

    async def follow() -> None:
        async for chunk in SessionReader(nc, topology, "live", poll_s=0.2).tail():
            seen.append(chunk.payload)
            if len(seen) == 6:
                return

    follower = asyncio.create_task(follow())
    await _publish(nc, topology, "live", range(3, 6))
    await asyncio.wait_for(follower, 10)
    assert seen == [str(k).encode() for k in range(6)]
