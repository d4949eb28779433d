"""The allowances' contract (``broker.AllowanceBoard``, docs/gateway.md "Limits and budgets";
ADR 0042) over the real bucket on the real server and the in-memory twin: concurrent changes
of one counter all apply (compare-and-set, retried), a change that leaves the pool writes
nothing; on the real server, a bucket the broker lost is made again by the Restorer, and a
broker restart keeps every counter and hold (file storage)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client

from tests.fixtures.broker import close_client
from tokenwire.broker import (
    AllowanceBoard,
    Allowances,
    EmbeddedServer,
    Hold,
    MemoryAllowances,
    Pool,
    Restorer,
    Topology,
    connect,
    ensure_limits_bucket,
    stream_info,
)


@pytest.fixture(params=["real", "memory"])
async def board(
    request: pytest.FixtureRequest, nc: Client, topology: Topology
) -> AsyncIterator[AllowanceBoard]:
    if request.param == "memory":
        yield MemoryAllowances()
        return
    await ensure_limits_bucket(nc, topology)
    yield Allowances(nc, topology.limits_bucket)


def plus_one(pool: Pool) -> Pool:
    return Pool(pool.used + 1, pool.holds)


async def test_concurrent_changes_of_one_counter_all_apply(board: AllowanceBoard) -> None:
    await asyncio.gather(*(board.update("rpm.key.a.1", plus_one, ttl_s=60) for _ in range(40)))
    assert (await board.read("rpm.key.a.1")).used == 40


async def test_a_limit_checked_in_the_change_is_never_passed(board: AllowanceBoard) -> None:
    def under_ten(pool: Pool) -> Pool | None:
        return plus_one(pool) if pool.used < 10 else None

    await asyncio.gather(*(board.update("rpm.key.b.1", under_ten, ttl_s=60) for _ in range(25)))
    assert (await board.read("rpm.key.b.1")).used == 10
    assert list(await board.pools()) == ["rpm.key.b.1"]


async def test_an_unknown_counter_is_empty(board: AllowanceBoard) -> None:
    assert await board.read("usd.key.nobody.2026-12-07") == Pool()


async def test_a_lost_bucket_is_made_again_by_the_restorer(nc: Client, topology: Topology) -> None:
    await ensure_limits_bucket(nc, topology)
    await nc.jetstream().delete_stream(f"KV_{topology.limits_bucket}")
    restorer = Restorer(nc, topology)
    board = Allowances(nc, topology.limits_bucket, restore=restorer.limits)
    assert (await board.update("conc.key.a", plus_one, ttl_s=60)).used == 1
    assert restorer.restored == 1
    info = await stream_info(nc, f"KV_{topology.limits_bucket}")
    assert info is not None


async def test_a_broker_restart_keeps_counters_and_holds(tmp_path: Path) -> None:
    server = EmbeddedServer(tmp_path / "nats").start()
    topology = Topology()
    hold = Hold(300, 2**62)
    try:
        nc = await connect(server.url)
        try:
            await ensure_limits_bucket(nc, topology)
            board = Allowances(nc, topology.limits_bucket)
            await board.update("usd.key.a.2026-12", lambda p: Pool(700, {"g1": hold}), ttl_s=60)
        finally:
            await close_client(nc)
        server.stop()
        server.start()
        nc = await connect(server.url)
        try:
            found = await Allowances(nc, topology.limits_bucket).read("usd.key.a.2026-12")
        finally:
            await close_client(nc)
    finally:
        server.stop()
    assert found == Pool(700, {"g1": hold})
