"""The compose cluster's NATS topology for real: three nodes from deploy/nats/nats-{1,2,3}.conf
(addresses moved to loopback), the topology at three replicas, the stream leader killed
while the gateway's publisher keeps sending, and nothing lost or duplicated."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.deploy._nats import (
    Connection,
    Node,
    close,
    connect_as,
    provision,
    running,
    urls_for,
    write_node_configs,
)
from tokenwire.broker import BrokerUnavailable, ChunkPublisher, SessionReader, Topology

SESSIONS = [f"cluster-{i}" for i in range(12)]
CHUNKS = 40  # per session, in one (turn 0, step 0)
ELECTION_BOUND_S = 30.0


def _publish_range(publisher: ChunkPublisher, start: int, stop: int) -> list[asyncio.Task[None]]:
    async def one(session: str) -> None:
        for ordinal in range(start, stop):
            await publisher.publish(
                f"{session}:{ordinal}".encode(), session, 0, 0, ordinal, first=ordinal == 0
            )

    return [asyncio.create_task(one(s)) for s in SESSIONS]


async def _wait_all_acked(publisher: ChunkPublisher) -> None:
    for session in SESSIONS:
        await publisher.wait_acked(session, 0, 0)


async def _leader(conn: Connection, topology: Topology) -> str:
    info = await conn.nc.jetstream().stream_info(topology.stream)
    assert info.cluster is not None
    assert info.cluster.leader is not None
    return info.cluster.leader


async def _new_leader(conn: Connection, topology: Topology, old: str) -> str:
    deadline = time.monotonic() + ELECTION_BOUND_S
    while time.monotonic() < deadline:
        try:
            leader = await _leader(conn, topology)
            if leader != old:
                return leader
        except Exception:
            pass
        await asyncio.sleep(0.25)
    raise AssertionError(f"no new leader within {ELECTION_BOUND_S} s")


async def _read_back(conn: Connection, topology: Topology) -> dict[str, Counter[str]]:
    stored: dict[str, Counter[str]] = {}
    for session in SESSIONS:
        stored[session] = await _read_session(conn, topology, session)
    return stored


async def _read_session(conn: Connection, topology: Topology, session: str) -> Counter[str]:
    """One session's stored payloads. Creating the reader's consumer needs the JetStream meta
    leader, which may itself be re-elected after the kill: retried within the bound."""
    deadline = time.monotonic() + ELECTION_BOUND_S
    while True:
        try:
            reader = SessionReader(conn.nc, topology, session, idle_timeout_s=10.0)
            return Counter([c.payload.decode() async for c in reader.replay()])
        except BrokerUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


def _wait_js_healthy(nodes: list[Node]) -> None:
    deadline = time.monotonic() + 30
    while not all(node.js_healthy() for node in nodes):
        assert time.monotonic() < deadline, "cluster not healthy"
        time.sleep(0.2)


@pytest.mark.slow
async def test_killing_the_stream_leader_loses_and_duplicates_nothing(tmp_path: Path) -> None:
    configs = write_node_configs(tmp_path)
    nodes = [Node(path, ports, f"nats-{i}") for i, (path, ports) in enumerate(configs, 1)]
    with running(nodes):
        _wait_js_healthy(nodes)
        provision(urls_for(nodes, "provisioner"), replicas=3)
        topology = Topology(replicas=3)
        gateway = await connect_as("gateway", urls_for(nodes, "gateway"))
        operator = await connect_as("operator", urls_for(nodes, "operator"))
        try:
            info = await gateway.nc.jetstream().stream_info(topology.stream)
            assert info.config.num_replicas == 3
            publisher = await ChunkPublisher(gateway.nc, topology).start()
            await asyncio.gather(*_publish_range(publisher, 0, CHUNKS // 2))
            await _wait_all_acked(publisher)

            leader = await _leader(gateway, topology)
            next(n for n in nodes if n.name == leader).kill()
            # Keep publishing through the election; the publisher resends with the same
            # Msg-Ids until the new leader acknowledges.
            await asyncio.gather(*_publish_range(publisher, CHUNKS // 2, CHUNKS))
            assert await _new_leader(operator, topology, leader) != leader
            await _wait_all_acked(publisher)
            # A retry of chunks that did land (same Msg-Ids) is dropped as a duplicate.
            await asyncio.gather(*_publish_range(publisher, CHUNKS // 2 - 5, CHUNKS // 2 + 5))
            await _wait_all_acked(publisher)
            stats = publisher.stats()
            await publisher.close()
            assert stats.failed == 0
            assert stats.duplicates >= 10 * len(SESSIONS)

            stored = await _read_back(operator, topology)
            expected = {s: Counter(f"{s}:{o}" for o in range(CHUNKS)) for s in SESSIONS}
            assert stored == expected
            assert gateway.violations() == []
            assert operator.violations() == []
        finally:
            await close(gateway)
            await close(operator)
