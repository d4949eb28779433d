"""Store faults under load: a PostgreSQL the test starts itself, stopped (immediate shutdown)
while the load runs and started again after it; a SQLite file made unwritable (another
process holds its write lock) while the load runs. Nothing is lost, the backlog drains, and
every stored message equals the scripted ground truth."""

from __future__ import annotations

import asyncio
import math
import sqlite3
import time
from pathlib import Path

import pytest

from tests.deploy._nats import close, connect_as
from tests.faults import _services as svc
from tests.faults._load import (
    SCRIPTED,
    SESSIONS,
    STORE_OUTAGE_S,
    Load,
    check,
    percentiles,
    wait_drained,
)
from tests.faults._postgres import own_postgres
from tests.faults._report import record
from tests.faults._scan import files, leaks
from tests.faults._single import TOPOLOGY, single_node
from tokenwire.broker import free_port
from tokenwire.services.scripted_provider import ScriptedServer
from tokenwire.store import open_store

STEP_S = SCRIPTED.length / SCRIPTED.token_rate  # one paced step, unloaded (0.6 s)
# the outage starts after the first turn and lasts the remaining ones: seven, or as many as
# a longer STORE_OUTAGE_S needs to stay under load
TURNS = 1 + max(7, math.ceil(STORE_OUTAGE_S / STEP_S))
# every turn of every session is a paced step (steps wait for each other on two cores)
CASE_BOUND_S = 150.0 + TURNS * (2.0 + SESSIONS / 10)


async def _outage(running: asyncio.Task[None]) -> None:
    """The store stays down for the rest of the load (STORE_OUTAGE_S 0, CI) or for
    STORE_OUTAGE_S while the load goes on (its turns outlast it; a load done sooner keeps
    the store down for the rest). A deliberate hold, the fault's length, not a wait for a
    condition."""
    if not STORE_OUTAGE_S:
        await running
        return
    started = time.monotonic()
    await asyncio.wait({running}, timeout=STORE_OUTAGE_S)
    await asyncio.sleep(max(0.0, STORE_OUTAGE_S - (time.monotonic() - started)))


async def _run(tmp_path: Path, store_url: str, case: str, down, up) -> None:
    port = free_port()
    with single_node(tmp_path) as node:
        gateway = svc.gateway(
            tmp_path,
            node.url("gateway"),
            f"sqlite:///{tmp_path / 'gw.db'}",
            f"http://127.0.0.1:{port}",
            tag=case,
        )
        assembler = svc.assembler(
            tmp_path, node.url("assembler"), store_url, tag=case, abandon_s=60.0
        )
        conn = await connect_as("operator", node.url("operator"))
        load = Load(tag=case, sessions=SESSIONS, turns=TURNS)
        with svc.running(gateway, assembler):
            await gateway.ready()
            await assembler.ready()
            async with ScriptedServer(SCRIPTED, port=port):
                running = asyncio.create_task(load.run(svc.base_url(gateway)))
                await load.first_turn_done.wait()
                await asyncio.to_thread(down)
                started = time.monotonic()
                await _outage(running)
                outage_s = time.monotonic() - started
                completed = load.counts()["ok"]
                # steps waiting when the store came back
                backlog = await asyncio.to_thread(up, completed)
                await running
            store = open_store(store_url)
            try:
                await wait_drained(store, load)
                tally = await check(store, load, conn.nc, TOPOLOGY)
            finally:
                await store.close()
                await close(conn)
            found = leaks(files([gateway.log, assembler.log]) + [("http", a) for a in load.answers])
            failed_commits = assembler.text().count("commit failed")
    record(
        f"store outage: {case}",
        "0 lost, backlog drained",
        sessions=SESSIONS,
        steps_ok=tally.ok,
        stored=tally.stored_messages,
        lost=tally.lost,
        duplicated=tally.duplicated,
        wrong=tally.wrong,
        verified=tally.verified,
        outage_s=round(outage_s, 1),
        latency_s={k: round(v, 2) for k, v in percentiles(load.latencies()).items()},
        failed_commits=failed_commits,
        backlog_at_recovery=backlog,
        secrets_found=len(found),
    )
    assert failed_commits >= 1 or backlog >= 1  # the assembler really met the outage
    assert tally.differences == []
    assert (tally.lost, tally.duplicated, tally.wrong, tally.failed) == (0, 0, 0, 0)
    assert tally.verified == SESSIONS
    assert found == []


@pytest.mark.slow
async def test_a_postgres_outage_under_load_loses_nothing(tmp_path: Path) -> None:
    with own_postgres() as pg:

        def start(completed: int) -> int:
            pg.start()
            return -1  # not measured: the failed commits prove the outage

        await asyncio.wait_for(
            _run(tmp_path, pg.url, "postgres-down", pg.stop, start), CASE_BOUND_S
        )


@pytest.mark.slow
async def test_an_unwritable_sqlite_file_under_load_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    holder: list[sqlite3.Connection] = []

    def lock() -> None:
        db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        db.execute("BEGIN EXCLUSIVE")  # no other writer until released
        holder.append(db)

    def unlock(completed: int) -> int:
        """Release the lock; how many completed steps were not stored yet (the backlog)."""
        db = holder.pop()
        stored = db.execute("SELECT count(*) FROM steps").fetchone()[0]  # inside the lock
        db.execute("ROLLBACK")
        return completed - int(stored)

    await asyncio.wait_for(
        _run(tmp_path, f"sqlite:///{path}", "sqlite-locked", lock, unlock), CASE_BOUND_S
    )
