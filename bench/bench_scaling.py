"""Scaling curves: cost per chunk as one step grows, assembler processes x partitions, memory
against concurrent open steps, gateway throughput against concurrent sessions."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import uvloop

from bench import bench_assembler as ba
from bench._procs import full_stack
from bench._suite import REPO, Figures, Profile, sizes
from bench.bench_stack import load
from tokenwire.broker import EmbeddedServer, Topology, connect, ensure_topology, free_port
from tokenwire.store import open_store

PHASE = "scaling"


def _progress(what: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


async def step_cost(fig: Figures, lengths: list[int]) -> None:
    """One step of n chunks assembled and committed (SQLite): CPU us per chunk, in-process."""
    points = []
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer(Path(tmp) / "nats").start()
        try:
            nc = await connect(server.url)
            store = open_store(f"sqlite:///{Path(tmp) / 'store.db'}")
            for n in lengths:
                t = ba.new_topology(f"sc{n}")
                t = dataclasses.replace(t, max_bytes=2 * 1024**3)
                await ensure_topology(nc, t, ack_wait_s=60.0, priority_timeout_s=2.0)
                envs = ba.workload(1, n - 2, f"sc{n}-")
                await ba.publish(nc, t, envs)
                cpu = time.process_time()
                await ba.assemble(server.url, t, store, 1, len(envs))
                us = (time.process_time() - cpu) / len(envs) * 1e6
                fig.put(PHASE, f"step_cost_us_{n}", us)
                points.append((n, us))
            await store.close()
            await nc.close()
        finally:
            server.stop()
    fig.curve(PHASE, "step_cost", points)
    fig.notes[f"axis:{PHASE}:step_cost"] = "chunks in the step|assembler CPU us per chunk"


async def processes_partitions(fig: Figures, grid: list[tuple[int, int]], steps: int) -> None:
    """``tokenwire assembler`` processes (k) on a stream of p partitions: chunks/s between the
    first and the last commit (start-up excluded), SQLite store shared."""
    for k, p in grid:
        with tempfile.TemporaryDirectory() as tmp:
            server = EmbeddedServer(Path(tmp) / "nats").start()
            try:
                nc = await connect(server.url)
                t = Topology(partitions=p)
                await ensure_topology(nc, t)
                envs = ba.workload(steps, ba.DELTAS, "pp")
                await ba.publish(nc, t, envs)
                await nc.close()
                db = Path(tmp) / "store.db"
                env = {
                    **os.environ,
                    "TOKENWIRE_NATS_URL": server.url,
                    "TOKENWIRE_STORE": f"sqlite:///{db}",
                    "TOKENWIRE_PARTITIONS": str(p),
                    "TOKENWIRE_DATA_DIR": tmp,
                }
                procs = [
                    subprocess.Popen(  # noqa: ASYNC220 - bench start-up, not a hot path
                        [sys.executable, "-m", "tokenwire", "assembler"],
                        cwd=REPO,
                        env={**env, "TOKENWIRE_ASSEMBLER_METRICS_ADDR": f"127.0.0.1:{free_port()}"},
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    for _ in range(k)
                ]
                try:
                    rate = await _committed_rate(db, steps, len(envs))
                finally:
                    for proc in procs:
                        proc.terminate()
                        proc.wait(15)
            finally:
                server.stop()
        fig.put(PHASE, f"assembler_k{k}_p{p}_per_s", rate)
    for p in sorted({p for _, p in grid}):
        pts = [(k, fig.get(PHASE, f"assembler_k{k}_p{p}_per_s")) for k, q in grid if q == p]
        if len(pts) > 1:
            fig.curve(PHASE, f"assembler_processes_p{p}", pts)
            fig.notes[f"axis:{PHASE}:assembler_processes_p{p}"] = "assembler processes|chunks/s"
    pts = [(p, fig.get(PHASE, f"assembler_k1_p{p}_per_s")) for k, p in grid if k == 1]
    if len(pts) > 1:
        fig.curve(PHASE, "assembler_partitions_k1", pts)
        fig.notes[f"axis:{PHASE}:assembler_partitions_k1"] = "partitions (1 process)|chunks/s"


async def _committed_rate(db: Path, steps: int, chunks: int) -> float:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        if not db.is_file():  # noqa: ASYNC240 - a stat per poll
            continue
        try:
            with sqlite3.connect(db) as conn:
                n, lo, hi = conn.execute(
                    "SELECT count(*), min(committed_ns), max(committed_ns) FROM steps"
                ).fetchone()
        except sqlite3.OperationalError:
            continue  # not migrated yet
        if n >= steps:
            return chunks / max(1e-3, (hi - lo) / 1e9)
    raise RuntimeError(f"the assemblers did not commit {steps} steps in time")


async def memory(fig: Figures, counts: list[int]) -> None:
    points = []
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer(Path(tmp) / "nats").start()
        try:
            nc = await connect(server.url)
            store = open_store(f"sqlite:///{Path(tmp) / 'store.db'}")
            for n in counts:
                ba.OPEN_STEPS = n
                t = ba.new_topology(f"mem{n}")
                await ensure_topology(nc, t, ack_wait_s=60.0, priority_timeout_s=2.0)
                grown, _ = await ba.memory(server.url, t, store)
                fig.put(PHASE, f"rss_mb_open_{n}", grown)
                points.append((n, grown))
            await store.close()
            await nc.close()
        finally:
            server.stop()
    fig.curve(PHASE, "memory_open_steps", points)
    fig.notes[f"axis:{PHASE}:memory_open_steps"] = "concurrent open steps|assembler RSS growth, MB"


async def sessions(fig: Figures, counts: list[int]) -> None:
    points = []
    async with full_stack(consumers=False) as s:
        for n in counts:
            rate, _, _ = await load(s.gateway_port, n, 1, 100, s.procs)
            fig.put(PHASE, f"gateway_sessions_{n}_per_s", rate)
            points.append((n, rate))
    fig.curve(PHASE, "sessions", points)
    fig.notes[f"axis:{PHASE}:sessions"] = "concurrent sessions (100 fragments each)|events/s"


def table(fig: Figures) -> str:
    rows = ["| curve | x | y |", "| --- | ---: | ---: |"]
    for name, points in fig.curves.get(PHASE, {}).items():
        xl, yl = fig.notes.get(f"axis:{PHASE}:{name}", "x|y").split("|")
        rows += [f"| {name}: {yl} at {xl} | {x:,.0f} | {y:,.1f} |" for x, y in points]
    rows += [
        "",
        "On 2 cores every curve of throughput against processes or partitions is "
        "flat at best: the broker, the assembler processes and the store writer share "
        "the same two cores, so a second process adds a competitor, not capacity; the "
        "bound is CPU (nats-server's delivery and the assembler's decode + fold + "
        "commit), not partition count. Cost per chunk at short steps includes each "
        "measurement's fixed start-up (consumers, first pull) spread over few chunks; "
        "RSS growth below ~5,000 open steps is within the allocator's noise.",
    ]
    return "\n".join(rows)


def run(fig: Figures, profile: Profile) -> str:
    _progress("scaling: cost per chunk against step length")
    uvloop.run(
        step_cost(
            fig,
            sizes(profile, [1_000], [1_000, 10_000, 100_000], [1_000, 10_000, 100_000, 1_000_000]),
        )
    )
    _progress("scaling: assembler processes x partitions")
    grid = sizes(
        profile,
        [(1, 4)],
        [(1, 1), (1, 4), (1, 16), (2, 16), (4, 16)],
        [(1, 1), (1, 4), (1, 16), (2, 16), (4, 16)],
    )
    uvloop.run(processes_partitions(fig, grid, sizes(profile, 100, 1_000, 5_000)))
    _progress("scaling: memory against open steps")
    uvloop.run(memory(fig, sizes(profile, [100], [1_000, 5_000, 10_000], [1_000, 10_000, 50_000])))
    _progress("scaling: gateway throughput against concurrent sessions")
    uvloop.run(
        sessions(fig, sizes(profile, [10], [10, 100, 500, 1_000], [10, 100, 500, 1_000, 2_000]))
    )
    return table(fig)
