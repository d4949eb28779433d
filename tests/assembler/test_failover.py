"""Three assembler processes on a 16-partition stream; the first one SIGKILLed mid-run.

Every session's stored messages must equal its script, with no chunk missing or doubled and
per-session sequences contiguous from 1, as if nothing had happened.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.assembler.harness import Plan, check_store, make_plan, publish_one
from tests.fixtures.broker import close_client
from tokenwire.broker import (
    ChunkPublisher,
    EmbeddedServer,
    Topology,
    connect,
    consumer_state,
    ensure_topology,
)
from tokenwire.schemas import ChunkEnvelope
from tokenwire.store import Store, open_store

REPO = Path(__file__).resolve().parents[2]


def start_assembler(url: str, store_url: str, log: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "TOKENWIRE_NATS_URL": url,
        "TOKENWIRE_STORE": store_url,
        "TOKENWIRE_PARTITIONS": "16",
        "TOKENWIRE_ASSEMBLER_PROVISION": "0",
        "TOKENWIRE_ASSEMBLER_METRICS_ADDR": "off",
    }
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tokenwire.services.assembler"],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


@pytest.mark.slow
async def test_sigkill_of_an_assembler_mid_run_loses_and_doubles_nothing(
    tmp_path: Path, db_url: str
) -> None:
    topology = Topology(partitions=16)
    plan = make_plan(seed=2024, sessions=100, turns=3)
    server = EmbeddedServer(tmp_path / "nats").start()
    nc = await connect(server.url)
    procs: list[subprocess.Popen[bytes]] = []
    store = open_store(db_url)
    try:
        await ensure_topology(nc, topology, ack_wait_s=3.0, priority_timeout_s=2.0)
        # The instance to be killed starts alone and is pinned on every partition. It gets every
        # session's first turn, and its second turn without the last two chunks: the first turn
        # commits, the second stays open (unacknowledged) on it when it is killed, so the kill
        # lands mid-run by construction, not by the clock.
        procs = [start_assembler(server.url, db_url, tmp_path / "a0.log")]
        publisher = await ChunkPublisher(nc, topology).start()
        before, after = split_plan(plan, hold_back=2)
        for env in before:
            await publish_one(publisher, env)
        await publisher.flush(10)
        await wait_until_pinned(nc, topology, timeout_s=30)
        await wait_for_steps(store, len(plan.steps), timeout_s=60)
        procs += [start_assembler(server.url, db_url, tmp_path / f"a{i}.log") for i in (1, 2)]
        stats_before = await store.stats()
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(5)
        for env in after:
            await publish_one(publisher, env)
        await publisher.flush(10)
        await publisher.close()
        await wait_until_settled(nc, topology, store, len(plan.steps) * 3, timeout_s=45)
        assert stats_before.steps == len(plan.steps), "only the first turns were committed"
        await check_store(store, plan)
        stats = await store.stats()
        assert (stats.steps, stats.chunks) == (300, plan.chunk_count)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        await store.close()
        await close_client(nc)
        server.stop()
    logs = [(tmp_path / f"a{i}.log").read_text() for i in (1, 2)]
    for proc, text in zip(procs[1:], logs, strict=True):
        assert proc.returncode == 0, text[-3000:]
    assert any("reading back" in text for text in logs), "no instance took a partition over"


def split_plan(plan: Plan, hold_back: int) -> tuple[list[ChunkEnvelope], list[ChunkEnvelope]]:
    """Every session's first step and its second without its last ``hold_back`` chunks; the rest."""
    before: list[ChunkEnvelope] = []
    after: list[ChunkEnvelope] = []
    for steps in plan.steps.values():
        (*_, first), (*_, second), *rest = steps
        cut = max(len(second) - hold_back, 0)
        before += [*first, *second[:cut]]
        after += [*second[cut:], *(env for *_, envs in rest for env in envs)]
    return before, after


async def wait_for_steps(store: Store, steps: int, timeout_s: float) -> None:
    """Until the store holds at least ``steps`` steps."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (stats := await store.stats()).steps < steps:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"only {stats.steps}/{steps} steps stored")
        await asyncio.sleep(0.1)


async def wait_until_pinned(nc, topology: Topology, timeout_s: float) -> None:
    """Until every partition's consumer has a pinned client."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        pinned = 0
        for p in range(topology.partitions):
            subject = f"$JS.API.CONSUMER.INFO.{topology.stream}.{topology.assembler_consumer(p)}"
            info = json.loads((await nc.request(subject, b"", timeout=2.0)).data)
            pinned += any(g.get("pinned_client_id") for g in info.get("priority_groups", []))
        if pinned == topology.partitions:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"only {pinned} partitions pinned")
        await asyncio.sleep(0.05)


async def wait_until_settled(nc, topology: Topology, store, steps: int, timeout_s: float) -> None:
    """Until the store holds every step and no partition has anything pending or unacked."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        stats = await store.stats()
        states = [
            await consumer_state(nc, topology.stream, topology.assembler_consumer(p))
            for p in range(topology.partitions)
        ]
        unsettled = sum(s.num_pending + s.num_ack_pending for s in states if s is not None)
        if stats.steps >= steps and unsettled == 0:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not settled: {stats.steps}/{steps} steps, {unsettled} unacked")
        await asyncio.sleep(0.25)
