"""Partition consumers against the real server: ownership, failover, ack verbs, dead letters."""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from nats.aio.client import Client

from tests.fixtures.broker import close_client, drop_topology, fresh_topology
from tests.fixtures.partitions import AssemblerConsumers
from tokenwire.broker import (
    ChunkPublisher,
    ConsumedMessage,
    PullSettings,
    Reject,
    Retry,
    Topology,
    connect,
    ensure_topology,
    parse_stored_subject,
)

SETTINGS = PullSettings(batch=64, expires_s=2.0, standby_expires_s=1.0)


@dataclass
class Recorder:
    """What each instance handled: (instance, partition, stream seq), in handling order."""

    started: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    done: dict[str, list[tuple[int, int]]] = field(default_factory=lambda: defaultdict(list))
    delay_s: float = 0.0

    def handler(self, topology: Topology, name: str) -> Callable[[ConsumedMessage], object]:
        async def handle(msg: ConsumedMessage) -> None:
            self.started[name].add(msg.stream_seq)
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            partition = parse_stored_subject(topology, msg.subject)[0]
            self.done[name].append((partition, msg.stream_seq))

        return handle

    def seqs(self) -> list[int]:
        return [seq for handled in self.done.values() for _, seq in handled]


async def eventually(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():  # noqa: ASYNC110 - polling state owned by other tasks
            await asyncio.sleep(0.05)


async def publish_sessions(nc: Client, topology: Topology, sessions: int, chunks: int) -> int:
    publisher = await ChunkPublisher(nc, topology).start()
    tag = random.randrange(10**9)
    for s in range(sessions):
        for k in range(chunks):
            await publisher.publish(b"c", f"s{tag}-{s}", 0, 0, k, first=k == 0)
    await publisher.flush(10)
    await publisher.close()
    return sessions * chunks


async def instance(
    nats_url: str, topology: Topology, recorder: Recorder, name: str
) -> tuple[Client, AssemblerConsumers]:
    nc = await connect(nats_url, name=name)
    consumers = AssemblerConsumers(nc, topology, recorder.handler(topology, name), SETTINGS)  # type: ignore[arg-type]  # the recorder's handler is typed to return object
    return nc, await consumers.start()


def owners_per_partition(recorder: Recorder) -> dict[int, set[str]]:
    owners: dict[int, set[str]] = defaultdict(set)
    for name, handled in recorder.done.items():
        for partition, _ in handled:
            owners[partition].add(name)
    return owners


async def test_each_partition_is_owned_by_one_instance_then_fails_over(
    nc: Client, nats_url: str, topology: Topology
) -> None:
    recorder = Recorder()
    nc_a, a = await instance(nats_url, topology, recorder, "a")
    nc_b, b = await instance(nats_url, topology, recorder, "b")
    try:
        total = await publish_sessions(nc, topology, sessions=40, chunks=20)
        await eventually(lambda: len(recorder.seqs()) == total)
        owners = owners_per_partition(recorder)
        assert all(len(names) == 1 for names in owners.values()), owners
        for handled in recorder.done.values():
            for p in range(topology.partitions):
                seqs = [seq for part, seq in handled if part == p]
                assert seqs == sorted(seqs)  # stream order within a partition
        assert set(a.active_partitions()).isdisjoint(b.active_partitions())
        assert set(a.active_partitions()) | set(b.active_partitions()) == set(owners)

        await a.stop()  # graceful: releases its pins, so b takes over without waiting
        more = await publish_sessions(nc, topology, sessions=40, chunks=5)
        await eventually(lambda: len(recorder.seqs()) == total + more)
        assert b.active_partitions() == list(range(topology.partitions))
        assert sorted(recorder.seqs()) == list(range(1, total + more + 1))  # exactly once
    finally:
        await a.stop()
        await b.stop()
        await close_client(nc_a)
        await close_client(nc_b)


@pytest.mark.slow
async def test_a_crashed_owner_is_replaced_and_nothing_is_lost(nc: Client, nats_url: str) -> None:
    topology = fresh_topology(partitions=2)
    await ensure_topology(nc, topology, ack_wait_s=2.0, priority_timeout_s=2.0)
    recorder = Recorder(delay_s=0.002)
    nc_a, a = await instance(nats_url, topology, recorder, "a")
    await eventually(lambda: all(c.stats.pulls > 0 for c in a.consumers.values()))
    nc_b, b = await instance(nats_url, topology, recorder, "b")
    try:
        total = await publish_sessions(nc, topology, sessions=20, chunks=50)
        await eventually(lambda: len(recorder.done["a"]) >= 100)
        assert recorder.done["b"] == []  # a was pinned first on both partitions
        acked_by_a = {seq for _, seq in recorder.done["a"]}  # their acks were already written
        await close_client(nc_a)  # crash: no nak, no unpin; its unacked messages time out
        await a.stop()
        more = await publish_sessions(nc, topology, sessions=10, chunks=10)
        await eventually(lambda: set(recorder.seqs()) == set(range(1, total + more + 1)), 30)
        assert b.active_partitions() == [0, 1]
        seqs = recorder.seqs()
        handled_twice = {s for s in set(seqs) if seqs.count(s) > 1}
        # Only what a received but had not acked when it died may be processed again.
        assert handled_twice <= recorder.started["a"] - acked_by_a
    finally:
        await b.stop()
        await close_client(nc_b)
        await drop_topology(nc, topology)


async def test_retry_redelivers_and_reject_dead_letters(
    nc: Client, nats_url: str, topology: Topology
) -> None:
    outcomes: list[tuple[int, int]] = []

    async def handle(msg: ConsumedMessage) -> None:
        ordinal = int(msg.data)
        outcomes.append((ordinal, msg.num_delivered))
        if ordinal == 1 and msg.num_delivered == 1:
            raise Retry(delay_s=0.1)
        if ordinal == 2:
            raise Reject("unreadable")

    publisher = await ChunkPublisher(nc, topology).start()
    for k in range(4):
        await publisher.publish(str(k).encode(), "verbs", 0, 0, k, first=k == 0)
    await publisher.close()
    consumers = await AssemblerConsumers(nc, topology, handle, SETTINGS).start()
    try:
        await eventually(lambda: len(outcomes) == 5)
        await eventually(lambda: sum(c.stats.rejected for c in consumers.consumers.values()) == 1)
        assert sorted(outcomes) == [(0, 1), (1, 1), (1, 2), (2, 1), (3, 1)]
        dlq = nc.jetstream()
        info = await dlq.stream_info(topology.dlq_stream)
        assert info.state.messages == 1
        dead = await dlq.get_msg(topology.dlq_stream, info.state.first_seq)
        assert dead.data == b"2"
        assert dead.headers is not None
        assert dead.headers["Tokenwire-Reason"] == "unreadable"
    finally:
        await consumers.stop()
