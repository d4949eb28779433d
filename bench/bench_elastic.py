"""Elastic shares (ADR 0016): time to balanced ownership, and throughput against assembler count.

``make bench BENCH=elastic`` (~4-6 min; ``BENCH_TRIALS`` trials of join and crash, default
20). Assemblers are real processes (``python -m tokenwire.services.assembler``) on one
embedded nats-server, 16 partitions, the tests' timings (heartbeat 0.5 s, member TTL 3 s,
priority timeout 2 s), PostgreSQL at ``TOKENWIRE_TEST_PG`` in a fresh schema.

(a) Time to balanced: one assembler holds all 16 partitions under a steady trickle on every
    partition (a pin is assigned with a delivery); a second joins. *Join*: from its first
    heartbeat in the membership bucket to the server's pins giving each 8 and both heartbeats
    agreeing. *Crash*: SIGKILL of the second, to the first holding all 16 again. p50 and max.
(b) Throughput against assembler count when the store is the bottleneck: a statement trigger
    on ``sessions`` sleeps ``SLOW_COMMIT_S`` in every commit transaction (the store's first
    statement per commit), and commits hold at most ``BATCH_STEPS`` steps. N = 1, 2, 4
    assemblers are started and balanced on a warm-up load, then ``STEPS`` steps are published
    at once; throughput is steps committed per second until all are in the store. The ratio
    is against N = 1 in the same run; the ideal is N.
"""

from __future__ import annotations

import asyncio
import os
import random
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from nats.aio.client import Client
from psycopg import sql
from tests.assembler.elastic import counts, ownership, start_assembler, stop_all
from tests.assembler.harness import publish_one
from tests.assembler.scripts import envelopes, text_step

from tokenwire.broker import (
    ChunkPublisher,
    EmbeddedServer,
    Topology,
    connect,
    ensure_topology,
    partition_of,
)
from tokenwire.services.assembler._members import MemberBoard
from tokenwire.store import open_store

PG = os.environ.get("TOKENWIRE_TEST_PG") or "postgresql://postgres@127.0.0.1:5432/test"
PARTITIONS = 16
TRIALS = int(os.environ.get("BENCH_TRIALS", "20"))
SLOW_COMMIT_S = 0.1
BATCH_STEPS = 16
STEPS = 2400
BOUND_S = 120.0


def progress(what: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def one_per_partition(prefix: str) -> list[str]:
    names: dict[int, str] = {}
    i = 0
    while len(names) < PARTITIONS:
        names.setdefault(partition_of(f"{prefix}{i}", PARTITIONS), f"{prefix}{i}")
        i += 1
    return list(names.values())


async def trickle(publisher: ChunkPublisher, stop: asyncio.Event, prefix: str = "trickle") -> int:
    """One short step per partition every ~50 ms, until ``stop``; returns the steps sent."""
    sessions = one_per_partition(prefix)
    turn = 0
    while not stop.is_set():
        for s in sessions:
            for env in envelopes(s, turn, 0, text_step(["a ", "b"])):
                await publish_one(publisher, env)
        turn += 1
        await asyncio.sleep(0.05)
    return turn * len(sessions)


async def until(check, what: str) -> float:  # type: ignore[no-untyped-def]  # check: any zero-argument async predicate
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not await check():
        if loop.time() - started > BOUND_S:
            raise RuntimeError(f"not reached in {BOUND_S} s: {what}")
        await asyncio.sleep(0.05)
    return loop.time() - started


async def agreed(nc: Client, t: Topology, want: dict[str, int]) -> bool:
    """The server's pins give each member its count, and the heartbeats report the same."""
    records = await MemberBoard(nc, t).read() or {}
    reported = {n: r.owned for n, r in records.items()}
    return counts(await ownership(nc, t)) == want and reported == want


async def balance_times(url: str, store_url: str, tmp: Path) -> tuple[list[float], list[float]]:
    t = Topology(partitions=PARTITIONS)
    nc = await connect(url)
    await ensure_topology(nc, t, ack_wait_s=5, priority_timeout_s=2, member_ttl_s=3)
    publisher = await ChunkPublisher(nc, t).start()
    stop = asyncio.Event()
    load = asyncio.create_task(trickle(publisher, stop))
    procs = [start_assembler([url], store_url, "a", tmp / "a.log", PARTITIONS)]
    joins: list[float] = []
    crashes: list[float] = []
    try:
        await until(lambda: agreed(nc, t, {"a": 16}), "a holds 16")
        board = MemberBoard(nc, t)
        for i in range(TRIALS):
            name = f"j{i}"
            procs.append(start_assembler([url], store_url, name, tmp / f"{name}.log", PARTITIONS))

            async def seen(name: str = name) -> bool:
                return name in (await board.names() or [])

            await until(seen, f"{name} heartbeats")
            want = {"a": 8, name: 8}
            joins.append(await until(lambda w=want: agreed(nc, t, w), "join"))
            procs[-1].send_signal(signal.SIGKILL)
            procs[-1].wait(10)
            crashes.append(await until(lambda: agreed(nc, t, {"a": 16}), "crash"))
            progress(f"trial {i}: join {joins[-1]:.2f} s, crash {crashes[-1]:.2f} s")
    finally:
        stop.set()
        await load
        await publisher.close()
        stop_all(procs)
        await nc.close()
    return joins, crashes


def slow_commits(schema_url: str, schema: str) -> None:
    with psycopg.connect(PG, autocommit=True) as conn:
        ident = sql.Identifier(schema)
        conn.execute(
            sql.SQL(
                "CREATE FUNCTION {}.slow_commit() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN PERFORM pg_sleep({}); RETURN NULL; END $$"
            ).format(ident, sql.Literal(SLOW_COMMIT_S))
        )
        conn.execute(
            sql.SQL(
                "CREATE TRIGGER slow_commit BEFORE INSERT ON {}.sessions "
                "FOR EACH STATEMENT EXECUTE FUNCTION {}.slow_commit()"
            ).format(ident, ident)
        )


async def throughput(url: str, store_url: str, tmp: Path, members: int, tag: str) -> float:
    """Balance ``members`` assemblers on a trickle, freeze them (SIGSTOP; the priority timeout
    and member TTL of this phase outlast the freeze, so pins and membership stay), publish
    the load, thaw them, and time the drain into the slow store."""
    t = Topology(
        prefix=tag,
        stream=f"TW_{tag}",
        events_stream=f"TWE_{tag}",
        dlq_stream=f"TWD_{tag}",
        steps_bucket=f"steps-{tag}",
        partitions=PARTITIONS,
        max_bytes=256 * 1024**2,
    )
    nc = await connect(url)
    await ensure_topology(nc, t, ack_wait_s=120, priority_timeout_s=60, member_ttl_s=90)
    store = open_store(store_url)
    names = [f"m{i}" for i in range(members)]
    env = {
        "TOKENWIRE_ASSEMBLER_BATCH_STEPS": str(BATCH_STEPS),
        "TOKENWIRE_ASSEMBLER_PRIORITY_TIMEOUT_S": "60",
        "TOKENWIRE_ASSEMBLER_MEMBER_TTL_S": "90",
    }
    procs = [_start_tagged(url, store_url, n, tmp / f"{tag}-{n}.log", t, env) for n in names]
    publisher = await ChunkPublisher(nc, t).start()
    try:
        before = (await store.stats()).steps
        stop = asyncio.Event()
        warm = asyncio.create_task(trickle(publisher, stop, prefix=f"{tag}warm"))
        share = PARTITIONS // members
        await until(lambda: agreed(nc, t, dict.fromkeys(names, share)), f"{members} balanced")
        stop.set()
        warmed = await warm
        await publisher.flush(30)

        async def committed(n: int) -> bool:
            return (await store.stats()).steps >= n

        await until(lambda: committed(before + warmed), "warm-up committed")
        for proc in procs:
            proc.send_signal(signal.SIGSTOP)
        try:
            rng = random.Random(members)
            for i in range(STEPS):
                session = f"{tag}load{i % 400}"
                for env_ in envelopes(session, i // 400, 0, text_step([rng.choice("xyz")])):
                    await publish_one(publisher, env_)
            await publisher.flush(60)
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGCONT)
        started = time.perf_counter()
        await until(lambda: committed(before + warmed + STEPS), "all committed")
        elapsed = time.perf_counter() - started
        assert counts(await ownership(nc, t)) == dict.fromkeys(names, share), "moved meanwhile"
        progress(f"{members} assemblers: {STEPS} steps in {elapsed:.1f} s")
        return STEPS / elapsed
    finally:
        await publisher.close()
        stop_all(procs)
        await store.close()
        await nc.close()


def _start_tagged(
    url: str, store_url: str, member: str, log: Path, t: Topology, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """An assembler process on a non-default topology: a tiny launcher sets the names."""
    fields = {
        "prefix": t.prefix,
        "stream": t.stream,
        "events_stream": t.events_stream,
        "dlq_stream": t.dlq_stream,
        "steps_bucket": t.steps_bucket,
        "partitions": t.partitions,
    }
    code = LAUNCHER.replace("FIELDS", repr(fields))
    full = {**os.environ, **_assembler_env(url, store_url, member, env)}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", code], env=full, stdout=out, stderr=subprocess.STDOUT
        )


LAUNCHER = """
import asyncio, dataclasses, logging, signal
from tokenwire.broker import Topology
from tokenwire.services.assembler import AssemblerSettings, run
logging.basicConfig(level=logging.INFO)
settings = dataclasses.replace(AssemblerSettings.from_env(), topology=Topology(**FIELDS))
async def main():
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await run(settings, stop)
asyncio.run(main())
"""


def _assembler_env(url: str, store_url: str, member: str, env: dict[str, str]) -> dict[str, str]:
    from tests.assembler.elastic import TIMINGS

    return {
        "TOKENWIRE_NATS_URL": url,
        "TOKENWIRE_STORE": store_url,
        "TOKENWIRE_PARTITIONS": str(PARTITIONS),
        "TOKENWIRE_ASSEMBLER_PROVISION": "0",
        "TOKENWIRE_ASSEMBLER_METRICS_ADDR": "off",
        "TOKENWIRE_ASSEMBLER_MEMBER": member,
        **TIMINGS,
        **env,
    }


def _table(joins: list[float], crashes: list[float], rates: dict[int, float]) -> str:
    rows = [
        "| measure | p50 | max | trials |",
        "| --- | --- | --- | --- |",
        f"| join -> balanced (8/8), s | {statistics.median(joins):.2f} | {max(joins):.2f} | "
        f"{len(joins)} |",
        f"| crash (SIGKILL) -> balanced (16), s | {statistics.median(crashes):.2f} | "
        f"{max(crashes):.2f} | {len(crashes)} |",
        "",
        f"| assemblers | steps/s (store: +{SLOW_COMMIT_S * 1000:.0f} ms per commit, "
        f"<= {BATCH_STEPS} steps per commit) | ratio to 1 | ideal |",
        "| --- | --- | --- | --- |",
    ]
    rows += [f"| {n} | {r:.0f} | {r / rates[1]:.2f} | {n} |" for n, r in rates.items()]
    return "\n".join(rows)


async def _main() -> str:
    with tempfile.TemporaryDirectory() as tmp_dir:
        tmp = Path(tmp_dir)
        server = EmbeddedServer(tmp / "nats").start()
        schema = f"tw_bench_{secrets.token_hex(4)}"
        with psycopg.connect(PG, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        store_url = f"{PG}?options=-csearch_path%3D{schema}"
        try:
            store = open_store(store_url)
            await store.stats()  # migrates: the tables exist for the trigger
            await store.close()
            rates: dict[int, float] = {}
            slow_commits(store_url, schema)
            for n in (1, 2, 4):
                rates[n] = await throughput(server.url, store_url, tmp, n, f"e{n}")
            joins, crashes = await balance_times(server.url, store_url, tmp)
            return _table(joins, crashes, rates)
        finally:
            server.stop()
            with psycopg.connect(PG, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                )


def main() -> str:
    return asyncio.run(_main())
