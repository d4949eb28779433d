"""Three assembler processes on a 16-partition stream; the first one SIGKILLed mid-run.

Every session's stored messages must equal its script, with no chunk missing or doubled and
per-session sequences contiguous from 1, as if nothing had happened.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.assembler.harness import check_store, eventually, make_plan, publish_one
from tests.fixtures.broker import close_client
from tokenwire.broker import ChunkPublisher, EmbeddedServer, Topology, connect, ensure_topology
from tokenwire.services.assembler._takeover import consumer_state
from tokenwire.store import open_store

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
            env=env, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip


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
        # The instance to be killed starts alone and is pinned by the first messages of every
        # partition; the two standbys join afterwards (pins do not move between live owners).
        procs = [start_assembler(server.url, db_url, tmp_path / "a0.log")]
        await asyncio.sleep(1.0)
        publisher = await ChunkPublisher(nc, topology).start()
        rng = random.Random(7)
        last_turn = asyncio.Event()  # released once the joiners run; the kill comes within it

        async def session(name: str) -> None:
            for turn, _, _, envs in plan.steps[name]:
                if turn == 2:
                    await last_turn.wait()
                for env in envs:
                    await publish_one(publisher, env)
                    await asyncio.sleep(rng.random() * 0.15)  # ~3.5 s per session

        publishing = asyncio.gather(*(session(s) for s in plan.steps))
        await wait_until_pinned(nc, topology, timeout_s=10)
        procs += [start_assembler(server.url, db_url, tmp_path / f"a{i}.log") for i in (1, 2)]
        await asyncio.sleep(1.5)
        last_turn.set()

        async def last_turn_committing() -> bool:
            return (await store.stats()).steps > 200

        await eventually(last_turn_committing, 30, "the last turn to start committing")
        stats_before = await store.stats()
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(5)
        await publishing
        await publisher.flush(10)
        await publisher.close()
        await wait_until_settled(nc, topology, store, len(plan.steps) * 3, timeout_s=45)
        assert 200 < stats_before.steps < 300, "the kill did not happen mid-run"
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
