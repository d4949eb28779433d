"""The assembler: throughput against the raw consume limit, latency, memory.

One embedded nats-server, one 16-partition stream holding the same chunks for every phase
(each phase gets fresh consumers):

(a) the raw limit: the broker's partition consumers acknowledging every message, no work;
(b) the assembler decoding, folding and committing to SQLite;
(c) the same to PostgreSQL (``TOKENWIRE_TEST_PG``, default the local server);
(d) publish -> commit latency at a steady offered load of 10,000 chunks/s (SQLite);
(e) resident memory with 10,000 steps open at once, beside the payload bytes they hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
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

from tokenwire.broker import (
    AssemblerConsumers,
    ChunkPublisher,
    ConsumedMessage,
    EmbeddedServer,
    Topology,
    connect,
    ensure_topology,
)
from tokenwire.schemas import ChunkEnvelope, Finish, TextDelta, TokenUsage, Usage, json_encoder
from tokenwire.services.assembler import Assembler, AssemblerSettings, AssemblyConfig
from tokenwire.store import CommittedStep, StepRecord, Store, open_store

PARTITIONS = 16
STEPS = 5_000
DELTAS = 18  # + usage + finish = 20 chunks per step, 100k chunks
OFFERED_RATE = 10_000
LATENCY_SECONDS = 4.0
OPEN_STEPS = 10_000
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


def workload(steps: int, deltas: int, tag: str, finish: bool = True) -> list[ChunkEnvelope]:
    """``steps`` steps over steps/5 sessions, sessions interleaved like a fleet's."""
    sessions = max(1, steps // 5)
    turns = steps // sessions
    per_session = [
        [e for t in range(turns) for e in step_envelopes(f"{tag}{s}", t, deltas, finish)]
        for s in range(sessions)
    ]
    out: list[ChunkEnvelope] = []
    for i in range(max(len(p) for p in per_session)):
        out.extend(p[i] for p in per_session if i < len(p))
    return out


async def publish(nc: Any, topology: Topology, envs: Sequence[ChunkEnvelope]) -> None:
    publisher = await ChunkPublisher(nc, topology, window=4096).start()
    for env in envs:
        await publisher.publish(
            json_encoder.encode(env), env.session, env.turn, env.step, env.ordinal,
            first=env.ordinal == 0,
        )  # fmt: skip
    await publisher.flush(30)
    await publisher.close()


async def fresh_consumers(nc: Any, topology: Topology) -> None:
    js = nc.jetstream()
    for p in range(topology.partitions):
        with contextlib.suppress(Exception):  # absent on the first call
            await js.delete_consumer(topology.stream, topology.assembler_consumer(p))
    await ensure_topology(nc, topology, ack_wait_s=60.0, priority_timeout_s=2.0)


async def raw_limit(url: str, topology: Topology, total: int) -> float:
    """(a) messages/s of the partition consumers acknowledging every message."""
    nc = await connect(url)
    done = asyncio.Event()
    count = 0

    async def handler(cm: ConsumedMessage) -> None:
        nonlocal count
        count += 1
        if count >= total:
            done.set()

    consumers = AssemblerConsumers(nc, topology, handler)
    started = time.perf_counter()
    await consumers.start()
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.perf_counter() - started
    await consumers.stop()
    await nc.close()
    return total / elapsed


def settings(url: str, topology: Topology, store_url: str) -> AssemblerSettings:
    return AssemblerSettings(
        nats_urls=(url,), store_url=store_url, topology=topology, provision=False,
        metrics_addr=None, assembly=AssemblyConfig(max_open_steps=50_000),
    )  # fmt: skip


async def assemble(url: str, topology: Topology, store: Store, steps: int, total: int) -> float:
    """(b), (c): chunks/s from start until every step is committed and acknowledged."""
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


class TimedStore:
    """A real store that notes when each step's commit returned (monotonic seconds)."""

    def __init__(self, real: Store) -> None:
        self.real = real
        self.done: dict[tuple[str, int], float] = {}

    async def commit(self, records: Sequence[StepRecord]) -> list[CommittedStep]:
        results = await self.real.commit(records)
        now = time.monotonic()
        for r in records:
            self.done[(r.session, r.turn)] = now
        return results

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


async def latency(url: str, topology: Topology, store: Store) -> tuple[float, float, float]:
    """(d) p50, p99 (ms) of finish-published -> commit returned, and the achieved rate."""
    nc = await connect(url)
    timed = TimedStore(store)
    assembler = Assembler(settings(url, topology, store.url), nc, timed)  # type: ignore[arg-type]
    await assembler.start()
    pub_nc = await connect(url)
    envs = workload(int(OFFERED_RATE * LATENCY_SECONDS / (DELTAS + 2)), DELTAS, "lat")
    publisher = await ChunkPublisher(pub_nc, topology, window=4096).start()
    finished: dict[tuple[str, int], float] = {}
    tick, per_tick = 0.01, int(OFFERED_RATE * 0.01)
    started = time.monotonic()
    for i in range(0, len(envs), per_tick):
        for env in envs[i : i + per_tick]:
            await publisher.publish(
                json_encoder.encode(env), env.session, env.turn, env.step, env.ordinal,
                first=env.ordinal == 0,
            )  # fmt: skip
            if isinstance(env.chunk, Finish):
                finished[(env.session, env.turn)] = time.monotonic()
        await asyncio.sleep(max(0.0, started + (i // per_tick + 1) * tick - time.monotonic()))
    rate = len(envs) / (time.monotonic() - started)
    while len(timed.done) < len(finished):  # noqa: ASYNC110 - polling a counter
        await asyncio.sleep(0.01)
    await publisher.close()
    await assembler.close()
    await nc.close()
    await pub_nc.close()
    lat = sorted((timed.done[k] - t) * 1000 for k, t in finished.items())
    return statistics.median(lat), lat[int(len(lat) * 0.99) - 1], rate


async def memory(url: str, topology: Topology, store: Store) -> tuple[float, float]:
    """(e) RSS growth (MB) with OPEN_STEPS steps open, and the payload MB they hold."""
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
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')  # type: ignore[arg-type]


def new_topology(tag: str) -> Topology:
    """Each phase reads its own stream, so no phase sees another's backlog."""
    return Topology(
        prefix=tag, stream=f"TW_{tag}", events_stream=f"TWE_{tag}", dlq_stream=f"TWD_{tag}",
        steps_bucket=f"steps-{tag}", partitions=PARTITIONS, max_bytes=256 * 1024**2,
    )  # fmt: skip


def progress(what: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


async def _phases(url: str, tmp: Path, schema: str) -> str:
    topology = new_topology("thr")
    nc = await connect(url)
    for t in (topology, new_topology("lat"), new_topology("mem")):
        await ensure_topology(nc, t, ack_wait_s=60.0, priority_timeout_s=2.0)
    envs = workload(STEPS, DELTAS, "b")
    await publish(nc, topology, envs)
    progress("raw")
    raw = await raw_limit(url, topology, len(envs))
    await fresh_consumers(nc, topology)
    sqlite = open_store(f"sqlite:///{tmp / 'store.db'}")
    progress("b")
    b = await assemble(url, topology, sqlite, STEPS, len(envs))
    await fresh_consumers(nc, topology)
    with psycopg.connect(PG, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')  # type: ignore[arg-type]
    pg = open_store(f"{PG}?options=-csearch_path%3D{schema}")
    progress("c")
    c = await assemble(url, topology, pg, STEPS, len(envs))
    progress("p50, p99, offered")
    p50, p99, offered = await latency(url, new_topology("lat"), sqlite)
    progress("grown, payload")
    grown, payload = await memory(url, new_topology("mem"), sqlite)
    await sqlite.close()
    await pg.close()
    await nc.close()
    return _table(raw, b, c, (p50, p99, offered), (grown, payload), len(envs))


def _table(
    raw: float, b: float, c: float, lat: tuple[float, float, float], mem: tuple[float, float],
    total: int,
) -> str:  # fmt: skip
    p50, p99, offered = lat
    grown, payload = mem
    return "\n".join(
        [
            f"{total:,} chunks ({STEPS:,} steps of 20), {PARTITIONS} partitions, one process.",
            "",
            "| measure | tokenwire | baseline (same run) | ratio | target |",
            "| --- | --- | --- | --- | --- |",
            f"| (a) raw consume + ack, msgs/s | {raw:,.0f} | — | 1.00 | — |",
            f"| (b) assemble + commit, SQLite, chunks/s | {b:,.0f} | {raw:,.0f} (a) "
            f"| {b / raw:.2f} | ≥ 0.40 |",
            f"| (c) assemble + commit, PostgreSQL, chunks/s | {c:,.0f} | {raw:,.0f} (a) "
            f"| {c / raw:.2f} | — |",
            f"| (d) publish → commit p50 at {offered:,.0f} chunks/s offered, ms | {p50:.1f} "
            "| — | — | — |",
            f"| (d) publish → commit p99, ms | {p99:.1f} | — | — | ≤ 100 |",
            f"| (e) RSS growth, {OPEN_STEPS:,} steps open, MB | {grown:.0f} "
            f"| {payload:.1f} payload MB held | {grown / payload:.1f}x | ≤ 300 MB |",
        ]
    )


def main() -> str:
    return asyncio.run(_main())


if __name__ == "__main__":
    print(main())
