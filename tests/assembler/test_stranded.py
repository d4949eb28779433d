"""A dead assembler's held steps, with no new traffic: another instance stores them long before
``ack_wait`` (issue 48's open finding; ADR 0045).

Real parts: one nats-server, assembler processes, a SQLite file. Assembler A alone stores
every session's first turn; then the store is locked (another connection holds its write
lock), the second turns are published whole, and A folds them but cannot commit: it holds
every one of their messages delivered and unacknowledged. A is SIGKILLed, the lock released,
B started, and nothing more is published. The server redelivers A's messages only after
``ack_wait`` (300 s here, the default) and pins a partition only when it delivers, so before
the consumer reset B got none of them for 300 s. Now B, allotted the partitions once A's
heartbeat expired, resets each stranded consumer and stores every step within
``STORED_BOUND_S`` of the kill, each equal to its script, nothing doubled, nothing left
unacknowledged.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.assembler.harness import check_store, make_plan, publish_one
from tests.assembler.test_failover import start_assembler, wait_for_steps
from tests.fixtures.broker import close_client
from tokenwire.broker import (
    ChunkPublisher,
    Connection,
    EmbeddedServer,
    Topology,
    connect,
    consumer_state,
    ensure_topology,
)
from tokenwire.store import open_store

pytestmark = pytest.mark.slow
PARTITIONS = 16
ACK_WAIT_S = 300.0
STORED_BOUND_S = 90.0
"""From the kill to every held step stored: the member TTL (6 s) and the priority timeout
(5 s) pass, then two lag polls (5 s apart) see the partition stranded; the rest is slack for
a loaded machine. Far below ``ACK_WAIT_S``, the only way back before the reset."""


async def _held(nc: Connection, topology: Topology) -> tuple[int, int]:
    """``(undelivered, delivered and unacknowledged)`` over every partition."""
    pending = acked = 0
    for p in range(topology.partitions):
        state = await consumer_state(nc, topology.stream, topology.assembler_consumer(p))
        pending += state.num_pending
        acked += state.num_ack_pending
    return pending, acked


async def _until_held(nc: Connection, topology: Topology, messages: int, bound_s: float) -> None:
    """Until every published message is delivered and ``messages`` are unacknowledged."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound_s
    while (held := await _held(nc, topology)) != (0, messages):
        assert loop.time() < deadline, f"not within {bound_s} s: (0, {messages}) held, {held}"
        await asyncio.sleep(0.2)


async def test_a_dead_holders_steps_are_stored_long_before_ack_wait(tmp_path: Path) -> None:
    topology = Topology(partitions=PARTITIONS)
    plan = make_plan(seed=48, sessions=40, turns=2)
    path = tmp_path / "store.db"
    store_url = f"sqlite:///{path}"
    server = EmbeddedServer(tmp_path / "nats").start()
    nc = await connect(server.url)
    store = open_store(store_url)
    procs: list[subprocess.Popen[bytes]] = []
    lock = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    try:
        await ensure_topology(nc, topology, ack_wait_s=ACK_WAIT_S)
        procs.append(start_assembler(server.url, store_url, tmp_path / "a.log"))
        publisher = await ChunkPublisher(nc, topology).start()
        first = [env for steps in plan.steps.values() for env in steps[0][3]]
        second = [env for steps in plan.steps.values() for env in steps[1][3]]
        for env in first:
            await publish_one(publisher, env)
        await publisher.flush(10)
        await wait_for_steps(store, len(plan.steps), timeout_s=60)

        lock.execute("BEGIN EXCLUSIVE")  # A folds the second turns but cannot commit them
        for env in second:
            await publish_one(publisher, env)
        await publisher.flush(10)
        await publisher.close()
        await _until_held(nc, topology, len(second), bound_s=60)

        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(5)
        killed_at = asyncio.get_running_loop().time()
        lock.execute("ROLLBACK")
        procs.append(start_assembler(server.url, store_url, tmp_path / "b.log"))
        await wait_for_steps(store, 2 * len(plan.steps), timeout_s=STORED_BOUND_S)
        stored_s = asyncio.get_running_loop().time() - killed_at
        print(f"\nevery held step stored {stored_s:.1f} s after the kill (ack_wait {ACK_WAIT_S} s)")

        await _until_held(nc, topology, 0, bound_s=30)  # B settled what it stored
        await check_store(store, plan)
        assert (await store.stats()).chunks == plan.chunk_count
    finally:
        lock.close()
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
    log = (tmp_path / "b.log").read_text()
    assert "consumer reset" in log, log[-3000:]
