"""ChunkPublisher against the real server: delivery, dedupe, the window, typed failures."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from nats.aio.client import Client

from tests.fixtures.broker import close_client, fresh_topology
from tokenwire.broker import (
    BrokerUnavailable,
    ChunkPublisher,
    EmbeddedServer,
    PublishTimeout,
    SessionReader,
    Topology,
    connect,
    ensure_topology,
    msg_id,
    parse_stored_subject,
)


async def _publish_session(
    publisher: ChunkPublisher, session: str, chunks: int, rng: random.Random
) -> None:
    for ordinal in range(chunks):
        payload = f"{session}|{ordinal}".encode()
        await publisher.publish(payload, session, 0, 0, ordinal, first=ordinal == 0)
        if rng.random() < 0.05:
            await asyncio.sleep(0)  # interleave sessions the way concurrent requests do


async def _read_session(nc: Client, topology: Topology, session: str) -> list[bytes]:
    reader = SessionReader(nc, topology, session)
    return [chunk.payload async for chunk in reader.replay()]


async def test_concurrent_sessions_arrive_exactly_once_in_order(
    nc: Client, topology: Topology
) -> None:
    seed = random.randrange(2**32)
    print(f"seed={seed}")
    rng = random.Random(seed)
    sizes = {f"s{i}-{rng.randrange(10**6)}": rng.randint(100, 300) for i in range(50)}
    publisher = await ChunkPublisher(nc, topology, window=256).start()
    await asyncio.gather(*(_publish_session(publisher, s, n, rng) for s, n in sizes.items()))
    for session in sizes:
        await publisher.wait_acked(session, 0, 0)
    await publisher.close()
    stats = publisher.stats()
    assert stats.acked == stats.published == sum(sizes.values())
    assert (stats.failed, stats.in_flight, stats.duplicates) == (0, 0, 0)
    info = await nc.jetstream().stream_info(topology.stream)
    assert info.state.messages == sum(sizes.values())
    for session, n in sizes.items():
        expected = [f"{session}|{k}".encode() for k in range(n)]
        assert await _read_session(nc, topology, session) == expected


async def test_first_and_next_chunks_are_stored_under_their_kind(
    nc: Client, topology: Topology
) -> None:
    publisher = await ChunkPublisher(nc, topology).start()
    for ordinal in range(3):
        await publisher.publish(b"x", "kinds", 1, 2, ordinal, first=ordinal == 0)
    await publisher.wait_acked("kinds", 1, 2)
    await publisher.close()
    reader = SessionReader(nc, topology, "kinds")
    chunks = [c async for c in reader.replay()]
    kinds = [parse_stored_subject(topology, c.subject)[2] for c in chunks]
    assert kinds == [True, False, False]
    assert [c.headers["Nats-Msg-Id"] for c in chunks] == [
        msg_id("kinds", 1, 2, k) for k in range(3)
    ]


async def test_republishing_the_same_msg_ids_does_not_duplicate(
    nc: Client, topology: Topology
) -> None:
    publisher = await ChunkPublisher(nc, topology).start()
    for _ in range(2):
        for ordinal in range(100):
            await publisher.publish(b"p", "dup", 0, 0, ordinal, first=ordinal == 0)
        await publisher.wait_acked("dup", 0, 0)
    await publisher.close()
    assert publisher.stats().duplicates == 100
    info = await nc.jetstream().stream_info(topology.stream)
    assert info.state.messages == 100


async def test_window_bounds_in_flight_and_unacked_steps_fail_typed(nc: Client) -> None:
    # No stream captures this prefix: every publish is answered "no responders" and retried
    # until the horizon, so the window fills and nothing is ever acked.
    unprovisioned = fresh_topology()
    publisher = ChunkPublisher(nc, unprovisioned, window=4, retry_horizon_s=1.0, ack_timeout_s=0.2)
    await publisher.start()
    for ordinal in range(4):
        await publisher.publish(b"x", "w", 0, 0, ordinal, first=ordinal == 0)
    assert publisher.stats().in_flight == 4
    blocked = asyncio.create_task(publisher.publish(b"x", "w", 0, 1, 0, first=True))
    await asyncio.sleep(0.3)
    assert not blocked.done()
    assert publisher.stats().in_flight == 4
    with pytest.raises(PublishTimeout) as caught:
        await publisher.wait_acked("w", 0, 0)
    assert caught.value.msg_id.startswith("w:0:0:")
    assert caught.value.waited_s >= 1.0
    await asyncio.wait_for(blocked, 5)  # the failures freed the window
    await publisher.close(timeout_s=0.1)
    stats = publisher.stats()
    assert stats.failed == 5
    assert stats.retried > 0


async def test_stopped_server_surfaces_publish_timeout(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path).start()
    nc = await connect(server.url)
    try:
        t = fresh_topology()
        await ensure_topology(nc, t)
        publisher = await ChunkPublisher(nc, t, retry_horizon_s=1.5, ack_timeout_s=0.3).start()
        await publisher.publish(b"ok", "gone", 0, 0, 0, first=True)
        await publisher.wait_acked("gone", 0, 0)
        server.stop()
        for ordinal in range(1, 20):
            await publisher.publish(b"lost?", "gone", 0, 0, ordinal, first=False)
        with pytest.raises(PublishTimeout):
            await publisher.wait_acked("gone", 0, 0, timeout_s=10)
        await publisher.close(timeout_s=0.1)
        assert publisher.stats().failed == 19
    finally:
        await close_client(nc)
        server.stop()


@pytest.mark.slow
async def test_a_message_failed_at_the_horizon_never_lands_when_the_broker_returns(
    tmp_path: Path,
) -> None:
    """A step the publisher failed (its caller told it was not captured) must not be stored
    later: while the broker is down nothing may wait in the client's reconnect buffer to be
    flushed after the horizon (issue 48: a 60 s outage stored such steps as messages)."""
    server = EmbeddedServer(tmp_path).start()
    nc = await connect(server.url)
    try:
        t = fresh_topology()
        await ensure_topology(nc, t)
        publisher = await ChunkPublisher(nc, t, retry_horizon_s=1.5, ack_timeout_s=0.3).start()
        await publisher.publish(b"ok", "late", 0, 0, 0, first=True)
        await publisher.wait_acked("late", 0, 0)
        server.kill()
        await _until(lambda: not nc.is_connected)  # the client knows: it is reconnecting
        for ordinal in range(1, 20):
            await publisher.publish(b"failed", "late", 0, 0, ordinal, first=False)
        with pytest.raises(PublishTimeout):
            await publisher.wait_acked("late", 0, 0, timeout_s=10)
        server.start()  # same port and store
        # a later step acked on the same connection: whatever the client held is written
        await publisher.publish(b"after", "later", 0, 0, 0, first=True)
        await publisher.wait_acked("later", 0, 0, timeout_s=30)
        await publisher.close()
        stored = await _read_session(nc, t, "late")
        assert stored == [b"ok"], f"{len(stored) - 1} failed chunks were stored after the horizon"
    finally:
        await close_client(nc)
        server.stop()


async def _until(condition: Callable[[], bool], bound_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + bound_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_publish_on_a_closed_connection_raises_broker_unavailable(
    nats_url: str, topology: Topology
) -> None:
    nc = await connect(nats_url)
    publisher = await ChunkPublisher(nc, topology).start()
    await nc.close()
    with pytest.raises(BrokerUnavailable):
        await publisher.publish(b"x", "closed", 0, 0, 0, first=True)


@pytest.mark.slow
async def test_retries_ride_out_a_server_restart_without_loss_or_duplicates(
    tmp_path: Path,
) -> None:
    server = EmbeddedServer(tmp_path).start()
    nc = await connect(server.url)
    try:
        t = fresh_topology()
        await ensure_topology(nc, t)
        publisher = await ChunkPublisher(nc, t, ack_timeout_s=0.5).start()
        for ordinal in range(200):
            await publisher.publish(b"a", "restart", 0, 0, ordinal, first=ordinal == 0)
        server.kill()
        for ordinal in range(200, 400):
            await publisher.publish(b"b", "restart", 0, 0, ordinal, first=False)
        await asyncio.sleep(1.0)
        server.start()  # same port and store: the stream and its dedupe window survive
        await publisher.wait_acked("restart", 0, 0, timeout_s=30)
        await publisher.close()
        ids = [c.headers["Nats-Msg-Id"] async for c in SessionReader(nc, t, "restart").replay()]
        assert sorted(ids, key=lambda i: int(i.rsplit(":", 1)[1])) == [
            msg_id("restart", 0, 0, k) for k in range(400)
        ]
    finally:
        await close_client(nc)
        server.stop()
