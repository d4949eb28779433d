"""The assembler: throughput against the raw consume limit, latency, memory.

One embedded nats-server, one 16-partition stream holding the same chunks for every phase
(each phase gets fresh consumers):

(a) the raw limit: the broker's partition consumers acknowledging every message, no work,
    with a batch handler (the assembler's mode) and with a per-message handler;
(b) the assembler decoding, folding and committing to SQLite;
(c) the same to PostgreSQL (``TOKENWIRE_TEST_PG``, default the local server);
(d) publish -> commit latency at a steady offered load of 10,000 chunks/s (SQLite), with the
    publisher in its own process (as the gateway is) and, for comparison, in the assembler's
    event loop;
(e) resident memory with 10,000 steps open at once, beside the payload bytes they hold.

Every phase runs under the process GC policy ``tokenwire assembler`` applies at start
(``tune_gc``, services/assembler/_gc.py); ``BENCH_DEFAULT_GC=1`` keeps CPython's defaults.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psutil
import psycopg
from psycopg import sql
from tests.fixtures.partitions import AssemblerConsumers
from tests.fixtures.stores import DelegatingStore

from tokenwire.broker import (
    ChunkPublisher,
    ConsumedMessage,
    EmbeddedServer,
    PullSettings,
    Topology,
    connect,
    ensure_topology,
)
from tokenwire.schemas import ChunkEnvelope, Finish, TextDelta, TokenUsage, Usage, json_encoder
from tokenwire.services.assembler import Assembler, AssemblerSettings, AssemblyConfig, tune_gc
from tokenwire.store import CommittedStep, StepRecord, Store, open_store

PARTITIONS = 16
STEPS = 5_000
DELTAS = 18  # + usage + finish = 20 chunks per step, 100k chunks
OFFERED_RATE = 10_000
LATENCY_SECONDS = 4.0
LOCKSTEP_BURST = int(OFFERED_RATE * LATENCY_SECONDS / (DELTAS + 2)) // 5
OPEN_STEPS = 10_000
REPO = Path(__file__).resolve().parents[1]
FIGURES: dict[str, float] = {}  # the last run's figures, for the suite (bench/_suite.py)
PG = os.environ.get("TOKENWIRE_TEST_PG") or "postgresql://postgres@127.0.0.1:5432/test"
T0 = 1_700_000_000_000_000_000


def step_envelopes(
    session: str, turn: int, deltas: int, finish: bool = True
) -> list[ChunkEnvelope]:
    chunks: list[Any] = [TextDelta(index=0, text=f"token{i} ") for i in range(deltas)]
    if finish:
        chunks += [Usage(usage=TokenUsage(input_tokens=10, output_tokens=deltas)), Finish("stop")]
    return [
        ChunkEnvelope(session, turn, 0, i, T0 + i, "scripted", "bench-model", c)
        for i, c in enumerate(chunks)
    ]


def workload(
    steps: int, deltas: int, tag: str, finish: bool = True, stagger: bool = False
) -> list[ChunkEnvelope]:
    """``steps`` steps over steps/5 sessions, sessions interleaved like a fleet's.

    Lock-step (default): every session sends its k-th chunk in the same round, so all
    sessions finish a step within one round: bursts of steps/5 closes at once. ``stagger``
    starts session s ``s % chunks-per-step`` rounds late, so at the same chunk rate the
    steps finish evenly spread in time.
    """
    sessions = max(1, steps // 5)
    turns = steps // sessions
    per_session = [
        [e for t in range(turns) for e in step_envelopes(f"{tag}{s}", t, deltas, finish)]
        for s in range(sessions)
    ]
    width = deltas + 2 if stagger else 1
    lead = [s % width if stagger else 0 for s in range(sessions)]
    out: list[ChunkEnvelope] = []
    for i in range(max(len(p) for p in per_session) + width):
        out.extend(p[i - d] for p, d in zip(per_session, lead, strict=True) if 0 <= i - d < len(p))
    return out


async def publish(nc: Any, topology: Topology, envs: Sequence[ChunkEnvelope]) -> None:
    publisher = await ChunkPublisher(nc, topology, window=4096).start()
    for env in envs:
        await publisher.publish(
            json_encoder.encode(env),
            env.session,
            env.turn,
            env.step,
            env.ordinal,
            first=env.ordinal == 0,
        )
    await publisher.flush(30)
    await publisher.close()


async def fresh_consumers(nc: Any, topology: Topology) -> None:
    js = nc.jetstream()
    for p in range(topology.partitions):
        with contextlib.suppress(Exception):  # absent on the first call
            await js.delete_consumer(topology.stream, topology.assembler_consumer(p))
    await ensure_topology(nc, topology, ack_wait_s=60.0, priority_timeout_s=2.0)


async def raw_limit(url: str, topology: Topology, total: int, *, batched: bool) -> float:
    """(a) messages/s of the partition consumers acknowledging every message (auto ack)."""
    process_gc()
    nc = await connect(url)
    done = asyncio.Event()
    count = 0

    async def handler(cm: ConsumedMessage) -> None:
        nonlocal count
        count += 1
        if count >= total:
            done.set()

    async def batch_handler(batch: list[ConsumedMessage]) -> None:
        nonlocal count
        count += len(batch)
        if count >= total:
            done.set()

    pull = PullSettings(batch=512)  # the assembler's pull_batch
    consumers = (
        AssemblerConsumers(nc, topology, settings=pull, batch_handler=batch_handler)
        if batched
        else AssemblerConsumers(nc, topology, handler, pull)
    )
    started = time.perf_counter()
    await consumers.start()
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.perf_counter() - started
    await consumers.stop()
    await nc.close()
    return total / elapsed


def process_gc() -> None:
    """What ``tokenwire assembler`` does at start (run() -> tune_gc), unless disabled."""
    if os.environ.get("BENCH_DEFAULT_GC") == "1":
        gc.set_threshold(700, 10, 10)
        gc.unfreeze()
    else:
        tune_gc()


def settings(url: str, topology: Topology, store_url: str) -> AssemblerSettings:
    return AssemblerSettings(
        nats_urls=(url,),
        store_url=store_url,
        topology=topology,
        provision=False,
        metrics_addr=None,
        assembly=AssemblyConfig(max_open_steps=50_000),
    )


async def assemble(url: str, topology: Topology, store: Store, steps: int, total: int) -> float:
    """(b), (c): chunks/s from start until every step is committed and acknowledged."""
    process_gc()
    nc = await connect(url)
    assembler = Assembler(settings(url, topology, store.url), nc, store)
    started = time.perf_counter()
    await assembler.start()
    while _committed(assembler) < steps:  # noqa: ASYNC110 - polling a counter
        await asyncio.sleep(0.005)
    elapsed = time.perf_counter() - started
    await assembler.close()
    await nc.close()
    return total / elapsed


def _delivered(assembler: Assembler) -> int:
    return sum(c.stats.delivered for c in assembler.partitions.consumers.values())


def _committed(assembler: Assembler) -> float:
    return sum(m._value.get() for m in assembler.metrics.steps._metrics.values())


class TimedStore(DelegatingStore):
    """A real store that notes when each step's commit returned (monotonic seconds)."""

    def __init__(self, real: Store) -> None:
        super().__init__(real)
        self.done: dict[tuple[str, int], float] = {}

    async def commit(self, records: Sequence[StepRecord]) -> list[CommittedStep]:
        results = await self.real.commit(records)
        now = time.monotonic()
        for r in records:
            self.done[(r.session, r.turn)] = now
        return results


async def latency(
    url: str, topology: Topology, store: Store, *, separate: bool, stagger: bool = True
) -> tuple[float, float, float]:
    """(d) p50, p99 (ms) of finish-published -> commit returned, and the achieved rate.

    ``separate``: the publisher runs in its own process (the gateway's place); both sides
    read CLOCK_MONOTONIC, which is one clock for the whole machine.
    """
    process_gc()
    nc = await connect(url)
    timed = TimedStore(store)
    assembler = Assembler(settings(url, topology, store.url), nc, timed)
    await assembler.start()
    tag = topology.prefix
    publishing = publish_elsewhere(url, tag, stagger) if separate else paced(url, tag, stagger)
    finished, rate = await publishing
    async with asyncio.timeout(60):
        while len(timed.done) < len(finished):  # noqa: ASYNC110 - polling a counter
            await asyncio.sleep(0.01)
    await assembler.close()
    await nc.close()
    lat = sorted((timed.done[k] - t) * 1000 for k, t in finished.items())
    return statistics.median(lat), lat[int(len(lat) * 0.99) - 1], rate


async def paced(url: str, tag: str, stagger: bool) -> tuple[dict[tuple[str, int], float], float]:
    """Publish the latency workload at OFFERED_RATE; when each step's finish went out."""
    pub_nc = await connect(url)
    steps = int(OFFERED_RATE * LATENCY_SECONDS / (DELTAS + 2))
    envs = workload(steps, DELTAS, tag, stagger=stagger)
    publisher = await ChunkPublisher(pub_nc, new_topology(tag), window=4096).start()
    finished: dict[tuple[str, int], float] = {}
    tick, per_tick = 0.01, int(OFFERED_RATE * 0.01)
    started = time.monotonic()
    for i in range(0, len(envs), per_tick):
        for env in envs[i : i + per_tick]:
            await publisher.publish(
                json_encoder.encode(env),
                env.session,
                env.turn,
                env.step,
                env.ordinal,
                first=env.ordinal == 0,
            )
            if isinstance(env.chunk, Finish):
                finished[(env.session, env.turn)] = time.monotonic()
        await asyncio.sleep(max(0.0, started + (i // per_tick + 1) * tick - time.monotonic()))
    rate = len(envs) / (time.monotonic() - started)
    await publisher.flush(30)
    await publisher.close()
    await pub_nc.close()
    return finished, rate


async def publish_elsewhere(
    url: str, tag: str, stagger: bool
) -> tuple[dict[tuple[str, int], float], float]:
    """:func:`paced` in a child process; its result comes back as JSON on stdout."""
    script = "import sys; from bench.bench_assembler import paced_main; paced_main(sys.argv[1:])"
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        url,
        tag,
        "stagger" if stagger else "lock-step",
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"the publisher process failed ({child.returncode})")
    result = json.loads(out)
    finished = {(s, t): at for s, t, at in result["finished"]}
    return finished, float(result["rate"])


def paced_main(argv: list[str]) -> None:
    """The publisher process of :func:`publish_elsewhere`: ``url tag shape`` in, JSON out."""
    url, tag, shape = argv
    finished, rate = asyncio.run(paced(url, tag, shape == "stagger"))
    rows = [[s, t, at] for (s, t), at in finished.items()]
    print(json.dumps({"rate": rate, "finished": rows}))


async def memory(url: str, topology: Topology, store: Store) -> tuple[float, float]:
    """(e) RSS growth (MB) with OPEN_STEPS steps open, and the payload MB they hold."""
    process_gc()
    envs = workload(OPEN_STEPS, 10, "mem", finish=False)
    nc = await connect(url)
    await publish(nc, topology, envs)
    payload = sum(len(json_encoder.encode(e)) for e in envs) / 1e6
    gc.collect()
    before = psutil.Process().memory_info().rss
    assembler = Assembler(settings(url, topology, store.url), nc, store)
    await assembler.start()
    while _delivered(assembler) < len(envs):  # noqa: ASYNC110 - polling a counter
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.2)
    gc.collect()
    grown = (psutil.Process().memory_info().rss - before) / 1e6
    assert assembler.assembly.open_steps == OPEN_STEPS, assembler.assembly.open_steps
    await assembler.close()
    await nc.close()
    return grown, payload


async def _main() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer(Path(tmp) / "nats").start()
        schema = f"tw_bench_{secrets.token_hex(4)}"
        try:
            return await _phases(server.url, Path(tmp), schema)
        finally:
            server.stop()
            with psycopg.connect(PG, autocommit=True) as conn:
                conn.execute(
                    sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema))
                )


def new_topology(tag: str) -> Topology:
    """Each phase reads its own stream, so no phase sees another's backlog."""
    return Topology(
        prefix=tag,
        stream=f"TW_{tag}",
        events_stream=f"TWE_{tag}",
        dlq_stream=f"TWD_{tag}",
        steps_bucket=f"steps-{tag}",
        partitions=PARTITIONS,
        max_bytes=256 * 1024**2,
    )


def progress(what: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


async def _phases(url: str, tmp: Path, schema: str) -> str:
    topology = new_topology("thr")
    nc = await connect(url)
    latency_tags = ("lat", "burst", "near")
    for t in (topology, *map(new_topology, latency_tags), new_topology("mem")):
        await ensure_topology(nc, t, ack_wait_s=60.0, priority_timeout_s=2.0)
    envs = workload(STEPS, DELTAS, "b")
    await publish(nc, topology, envs)
    total = len(envs)
    del envs  # the benchmark's own copy is not the assembler's heap
    progress("warm-up (the server's first read of the stream is slower)")
    await raw_limit(url, topology, total, batched=True)
    await fresh_consumers(nc, topology)
    progress("raw, batch handler")
    raw = await raw_limit(url, topology, total, batched=True)
    await fresh_consumers(nc, topology)
    progress("raw, per-message handler")
    raw_one = await raw_limit(url, topology, total, batched=False)
    await fresh_consumers(nc, topology)
    sqlite = open_store(f"sqlite:///{tmp / 'store.db'}")
    progress("b")
    b = await assemble(url, topology, sqlite, STEPS, total)
    await fresh_consumers(nc, topology)
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    pg = open_store(f"{PG}?options=-csearch_path%3D{schema}")
    progress("c")
    c = await assemble(url, topology, pg, STEPS, total)
    progress("latency, publisher in its own process")
    apart = await latency(url, new_topology("lat"), sqlite, separate=True)
    progress("latency, lock-step sessions")
    burst = await latency(url, new_topology("burst"), sqlite, separate=True, stagger=False)
    progress("latency, publisher in the same event loop")
    near = await latency(url, new_topology("near"), sqlite, separate=False)
    progress("grown, payload")
    grown, payload = await memory(url, new_topology("mem"), sqlite)
    await sqlite.close()
    await pg.close()
    await nc.close()
    FIGURES.update(
        raw_batch_per_s=raw,
        raw_one_per_s=raw_one,
        sqlite_per_s=b,
        postgres_per_s=c,
        commit_p50_ms=apart[0],
        commit_p99_ms=apart[1],
        rss_open_mb=grown,
    )
    return _table((raw, raw_one), b, c, (apart, burst, near), (grown, payload), total)


Latency = tuple[float, float, float]


def _table(
    raws: tuple[float, float],
    b: float,
    c: float,
    lat: tuple[Latency, Latency, Latency],
    mem: tuple[float, float],
    total: int,
) -> str:
    (raw, raw_one), ((p50, p99, offered), burst, near) = raws, lat
    grown, payload = mem
    gc_note = "CPython's default GC" if os.environ.get("BENCH_DEFAULT_GC") == "1" else "tune_gc()"
    return "\n".join(
        [
            f"{total:,} chunks ({STEPS:,} steps of 20), {PARTITIONS} partitions, {gc_note}. "
            "(d): staggered sessions, publisher in its own process.",
            "",
            "| measure | tokenwire | baseline (same run) | ratio | target |",
            "| --- | --- | --- | --- | --- |",
            f"| (a) raw consume + ack, batch handler, msgs/s | {raw:,.0f} | — | 1.00 | — |",
            f"| (a) raw consume + ack, per-message handler, msgs/s | {raw_one:,.0f} "
            f"| {raw:,.0f} (a, batch) | {raw_one / raw:.2f} | — |",
            f"| (b) assemble + commit, SQLite, chunks/s | {b:,.0f} | {raw:,.0f} (a, batch) "
            f"| {b / raw:.2f} | ≥ 0.40 |",
            f"| (c) assemble + commit, PostgreSQL, chunks/s | {c:,.0f} | {raw:,.0f} (a, batch) "
            f"| {c / raw:.2f} | — |",
            f"| (d) publish → commit p50 at {offered:,.0f} chunks/s offered, ms "
            f"| {p50:.1f} | — | — | — |",
            f"| (d) publish → commit p99, same run, ms | {p99:.1f} | — | — | ≤ 100 |",
            f"| (d') p50 / p99, lock-step sessions (bursts of {LOCKSTEP_BURST} step closes), "
            f"ms | {burst[0]:.1f} / {burst[1]:.1f} | — | — | — |",
            f"| (d'') p50 / p99, publisher in the assembler's event loop, ms "
            f"| {near[0]:.1f} / {near[1]:.1f} | — | — | — |",
            f"| (e) RSS growth, {OPEN_STEPS:,} steps open, MB | {grown:.0f} "
            f"| {payload:.1f} payload MB held | {grown / payload:.1f}x | ≤ 300 MB |",
        ]
    )


def main() -> str:
    return asyncio.run(_main())


if __name__ == "__main__":
    print(main())
