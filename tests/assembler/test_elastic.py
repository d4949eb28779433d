"""Elastic shares (ADR 0016) on a real three-node JetStream cluster, streams at three replicas.

Sixteen partitions, scripted sessions published while assemblers come and go: one assembler,
two more join (each ends with 5 or 6 partitions), one stops gracefully and one is SIGKILLed
(their partitions move to the survivor). The store must equal the scripts: every step once,
in order, sequences contiguous from 1, no chunk missing or doubled.

Load is published in phases, each released by the test, so every membership change happens
while sessions are still publishing (the last phase starts only after the kill).
"""

from __future__ import annotations

import asyncio
import random
import signal
import subprocess
from pathlib import Path

import pytest
from nats.aio.client import Client

from tests.assembler.elastic import (
    MEMBER_TTL_S,
    PRIORITY_TIMEOUT_S,
    ownership,
    start_assembler,
    stop_all,
    wait_for_shares,
)
from tests.assembler.harness import Plan, check_store, make_plan, publish_one
from tests.assembler.scripts import random_script
from tests.assembler.test_failover import wait_until_settled
from tests.fixtures.broker import close_client
from tokenwire.broker import (
    ChunkPublisher,
    EmbeddedCluster,
    Topology,
    TopologyError,
    connect,
    ensure_topology,
    partition_of,
)
from tokenwire.store import open_store

PARTITIONS = 16
SESSIONS = 100
TURNS = 4  # one per phase: turn k is published after membership change k
BALANCE_BOUND_S = 40.0
"""The wait bound on a busy machine; ADR 0016 derives the expected time (a few heartbeats
plus the hand-over wait after a join; the member TTL or the priority timeout after a crash)
and the benchmark measures it."""


def filler_plan(seed: int, turns: int) -> Plan:
    """One long session per partition: keeps every partition busy (a pin is assigned with a
    delivery, so an idle partition has no owner to balance) until the test says stop."""
    rng = random.Random(seed)
    plan, covered, i = Plan(), set[int](), 0
    while len(covered) < PARTITIONS:
        name, i = f"fill{i}", i + 1
        if partition_of(name, PARTITIONS) in covered:
            continue
        covered.add(partition_of(name, PARTITIONS))
        for turn in range(turns):
            plan.add(name, turn, 0, random_script(rng))
    return plan


async def publish_phased(publisher: ChunkPublisher, plan: Plan, gates: list[asyncio.Event]) -> None:
    """Each session's turn ``k`` waits for gate ``k``."""
    rng = random.Random(5)

    async def session(name: str) -> None:
        for turn, _step, _script, envs in plan.steps[name]:
            await gates[turn].wait()
            for env in envs:
                await publish_one(publisher, env)
                await asyncio.sleep(rng.random() * 0.05)

    await asyncio.gather(*(session(s) for s in plan.steps))


async def publish_filler(publisher: ChunkPublisher, plan: Plan, stop: asyncio.Event) -> None:
    """Publish each filler session turn by turn until ``stop``; then trim ``plan`` to what was
    published (the ground truth of the filler sessions)."""

    async def session(name: str) -> None:
        steps = plan.steps[name]
        for done, (*_, envs) in enumerate(steps):
            if stop.is_set():
                del steps[done:]
                return
            for env in envs:
                await publish_one(publisher, env)
                await asyncio.sleep(0.02)
        raise AssertionError(f"filler session {name} ran out of turns")

    await asyncio.gather(*(session(s) for s in plan.steps))


async def provision(nc: Client, topology: Topology) -> None:
    """Provision once the cluster elected its meta leader (a moment after the routes form)."""
    for attempt in range(200):
        try:
            await ensure_topology(
                nc, topology, ack_wait_s=5.0, priority_timeout_s=PRIORITY_TIMEOUT_S,
                member_ttl_s=MEMBER_TTL_S,
            )  # fmt: skip
            return
        except TopologyError:
            if attempt == 199:
                raise
            await asyncio.sleep(0.1)


@pytest.mark.slow
@pytest.mark.postgres
async def test_assemblers_join_leave_and_crash_sharing_sixteen_partitions(
    tmp_path: Path, pg_url: str
) -> None:
    topology = Topology(partitions=PARTITIONS, replicas=3, max_bytes=256 * 1024**2)
    plan = make_plan(seed=16, sessions=SESSIONS, turns=TURNS)
    filler = filler_plan(seed=17, turns=600)
    cluster = EmbeddedCluster(tmp_path / "nats", nodes=3).start()
    nc = await connect(cluster.urls)
    store = open_store(pg_url)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(member: str) -> None:
        procs[member] = start_assembler(
            cluster.urls, pg_url, member, logs / f"{member}.log", PARTITIONS
        )

    try:
        await provision(nc, topology)
        publisher = await ChunkPublisher(nc, topology).start()
        gates = [asyncio.Event() for _ in range(TURNS)]
        gates[0].set()
        stop_filler = asyncio.Event()
        publishing = asyncio.gather(
            publish_phased(publisher, plan, gates), publish_filler(publisher, filler, stop_filler)
        )

        start("a")
        await wait_for_shares(nc, topology, {"a": (16, 16)}, BALANCE_BOUND_S)
        start("b")
        start("c")
        gates[1].set()
        joined_s = await wait_for_shares(nc, topology, {m: (5, 6) for m in "abc"}, BALANCE_BOUND_S)
        print(f"join of two: balanced after {joined_s:.1f} s")
        gates[2].set()
        procs["b"].send_signal(signal.SIGTERM)  # graceful: leaves, commits, releases
        assert procs["b"].wait(30) == 0, (logs / "b.log").read_text()[-3000:]
        left_s = await wait_for_shares(nc, topology, {"a": (8, 8), "c": (8, 8)}, BALANCE_BOUND_S)
        print(f"graceful leave: balanced after {left_s:.1f} s")
        owned_by_c = [p for p, m in (await ownership(nc, topology)).items() if m == "c"]
        procs["c"].send_signal(signal.SIGKILL)
        procs["c"].wait(10)
        gates[3].set()
        crash_s = await wait_for_shares(nc, topology, {"a": (16, 16)}, BALANCE_BOUND_S)
        print(f"crash: {len(owned_by_c)} partitions moved after {crash_s:.1f} s")

        stop_filler.set()
        await publishing
        await publisher.flush(15)
        await publisher.close()
        steps = SESSIONS * TURNS
        filler_steps = sum(len(v) for v in filler.steps.values())
        await wait_until_settled(nc, topology, store, steps + filler_steps, timeout_s=90)
        await check_store(store, plan)
        await check_store(store, filler)
        stats = await store.stats()
        assert (stats.steps, stats.chunks) == (
            steps + filler_steps,
            plan.chunk_count + filler.chunk_count,
        )
    finally:
        stop_all(list(procs.values()))
        await store.close()
        await close_client(nc)
        cluster.stop()
    assert procs["a"].returncode == 0, (logs / "a.log").read_text()[-3000:]
    log_a = (logs / "a.log").read_text()
    assert "reading back" in log_a, "the survivor never took a partition over"
