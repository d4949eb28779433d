"""The capacity model's inputs (issue 27 part 4): the whole stack, shipped defaults, sessions
streaming at 50 tokens/s each.

One fresh stack (``bench._procs.full_stack``: nats-server, scripted provider, gateway,
assembler to SQLite, telemetry, each a process) with the defaults a deployment gets: frames on
with the 200 ms linger (ADR 0024), S2 on the chunk stream (ADR 0023), one shard, R1. Phases,
in order, on that one stack:

- **idle** (:data:`IDLE_S`): every process's CPU with no load, its per-time cost (heartbeats,
  pulls, lag polls), reported so the per-chunk figures can be read with and without it;
- **paced** at each of :data:`LOADS` concurrent sessions: every session sends steps of
  :data:`FRAGMENTS` text fragments at :data:`RATE` per second (the scripted provider paces
  them: 50 tokens/s per session, the issue's premise), one step after another on the same
  session id, for :data:`WINDOW_S` seconds (starts spread over a second). Per load, from the
  first request to the store having committed every chunk: each process's CPU per chunk
  (``/proc`` user + system, gross; and net of the idle rate), broker messages per chunk
  (the chunk stream's ``last_seq``), bytes per chunk the stream accounts (``state.bytes``,
  what ``max_bytes`` counts), writes per step to the step registry's KV bucket and to the
  events stream (their ``last_seq``), and the chunk rate achieved against the nominal;
- **disk**: the stack stopped (every block written and S2-compressed), the chunk stream's
  files over the chunks it holds: bytes per chunk on disk.

A second fresh stack runs the stack table's full-speed load (``bench_stack.load``: 50
keep-alive callers, 4 requests of 200 fragments each) for the same per-chunk figures at full
speed, the row today's model used. Then both again with frames off
(``TOKENWIRE_FRAMES=false``: one v1 message per chunk, the wire before issue 27), their
figures under the key prefix :data:`FRAMES_OFF_PREFIX`: the capacity model's same-run
baseline. Run: ``python -m bench paced`` (phase ``paced``; ~4 min).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from pathlib import Path

import psutil
import uvloop

from bench import bench_gateway as gw
from bench._procs import cpu_s, full_stack
from bench.bench_compression import disk_bytes
from bench.bench_stack import FRAMES_OFF, load
from tokenwire.broker import Topology, connect

LOADS: tuple[int, ...] = (50, 100, 150)
FRAGMENTS = 100
RATE = 50
WINDOW_S = 30.0
IDLE_S = 10.0
FULL_CALLERS, FULL_EACH, FULL_FRAGMENTS = 50, 4, 200
PROCS = ("gateway", "assembler", "telemetry", "nats", "scripted-provider", "load")
FRAMES_OFF_PREFIX = "v1_"
"""The frames-off pass's figures: ``v1_s150_cpu_us_per_chunk_gateway``, ``v1_full_...``."""
FIGURES: dict[str, float] = {}
NOTES: list[str] = []


def scale(sessions: tuple[int, ...], window_s: float, idle_s: float) -> None:
    """The profile's sizes (``bench.__main__._scale``)."""
    global LOADS, WINDOW_S, IDLE_S
    LOADS, WINDOW_S, IDLE_S = sessions, window_s, idle_s


async def _seqs(nats_url: str) -> dict[str, float]:
    """The chunk, events and step-registry streams' ``last_seq`` and the chunk stream's bytes."""
    t = Topology()
    nc = await connect(nats_url)
    try:
        js = nc.jetstream()
        chunks = (await js.stream_info(t.stream)).state
        events = (await js.stream_info(t.events_stream)).state
        kv = (await js.stream_info(f"KV_{t.steps_bucket}")).state
        return {
            "chunk_msgs": chunks.last_seq,
            "chunk_bytes": chunks.bytes,
            "event_writes": events.last_seq,
            "kv_writes": kv.last_seq,
        }
    finally:
        await nc.close()


def _store(db: Path) -> tuple[int, int]:
    with sqlite3.connect(db) as conn:
        steps, chunks = conn.execute(
            "SELECT count(*), coalesce(sum(chunk_count), 0) FROM steps"
        ).fetchone()
    return int(steps), int(chunks)


async def _settled(db: Path, nats_url: str, timeout_s: float = 120.0) -> tuple[int, int]:
    """(steps, chunks) in the store once it has every chunk the stream holds (bounded)."""
    deadline = time.monotonic() + timeout_s
    last = (-1, -1)
    while time.monotonic() < deadline:
        now = _store(db)
        if now == last and now[1] > 0:  # two looks 1 s apart agree: the assembler is idle
            return now
        last = now
        await asyncio.sleep(1.0)
    return last


def _cpu(procs: dict[str, psutil.Process]) -> dict[str, float]:
    return {n: cpu_s(p) for n, p in procs.items() if n in PROCS}


async def _sessions(port: int, sessions: int, window_s: float) -> tuple[int, float]:
    """``sessions`` callers, each streaming paced steps one after another until the window
    ends; (the steps sent, their mean wall time in seconds)."""
    options = f"fragments={FRAGMENTS}&rate={RATE}"
    end = time.monotonic() + window_s
    tag = time.time_ns()

    async def one(i: int) -> None:
        await asyncio.sleep(i / sessions)  # starts spread over a second
        caller = await gw.Caller.open(port)
        req = gw.streaming_request(port, "/v1/chat/completions", f"cap-{tag}-{i}", options)
        try:
            while time.monotonic() < end:
                began = time.perf_counter()
                await caller.stream(req)
                durations.append(time.perf_counter() - began)
        finally:
            caller.close()

    durations: list[float] = []
    await asyncio.gather(*(one(i) for i in range(sessions)))
    return len(durations), sum(durations) / max(1, len(durations))


async def _paced(s: object, sessions: int, idle: dict[str, float], prefix: str) -> None:
    port, url = s.gateway_port, s.stack.nats_url  # type: ignore[attr-defined]
    db, procs = s.data / "store.db", s.procs  # type: ignore[attr-defined]
    seq0, store0, cpu0 = await _seqs(url), _store(db), _cpu(procs)
    started = time.perf_counter()
    sent, step_s = await _sessions(port, sessions, WINDOW_S)
    streamed = time.perf_counter() - started
    store1 = await _settled(db, url)
    elapsed = time.perf_counter() - started
    cpu1, seq1 = _cpu(procs), await _seqs(url)
    steps, chunks = store1[0] - store0[0], max(1, store1[1] - store0[1])
    key = f"{prefix}s{sessions}"
    put = FIGURES.__setitem__
    put(f"{key}_sessions", sessions)
    put(f"{key}_steps", steps)
    put(f"{key}_steps_sent", sent)
    put(f"{key}_chunks", chunks)
    put(f"{key}_chunks_per_step", chunks / max(1, steps))
    put(f"{key}_chunks_per_s", chunks / streamed)
    put(f"{key}_step_seconds", step_s)
    put(f"{key}_pace", FRAGMENTS / RATE / step_s)  # 1.0: the provider's pace kept end to end
    put(f"{key}_seconds", elapsed)
    put(f"{key}_messages_per_chunk", (seq1["chunk_msgs"] - seq0["chunk_msgs"]) / chunks)
    put(f"{key}_stream_bytes_per_chunk", (seq1["chunk_bytes"] - seq0["chunk_bytes"]) / chunks)
    put(f"{key}_kv_writes_per_step", (seq1["kv_writes"] - seq0["kv_writes"]) / max(1, steps))
    put(
        f"{key}_event_writes_per_step",
        (seq1["event_writes"] - seq0["event_writes"]) / max(1, steps),
    )
    gross = net = 0.0
    for name in cpu0:
        used = cpu1[name] - cpu0[name]
        put(f"{key}_cpu_us_per_chunk_{name}", used / chunks * 1e6)
        put(
            f"{key}_net_cpu_us_per_chunk_{name}",
            max(0.0, used - idle.get(name, 0.0) * elapsed) / chunks * 1e6,
        )
        if name not in {"load", "scripted-provider"}:
            gross += used
            net += max(0.0, used - idle.get(name, 0.0) * elapsed)
    for name in cpu0:
        put(f"{key}_busy_{name}", (cpu1[name] - cpu0[name]) / elapsed)
    put(f"{key}_cpu_us_per_chunk_pipeline", gross / chunks * 1e6)
    put(f"{key}_net_cpu_us_per_chunk_pipeline", net / chunks * 1e6)


async def _idle(procs: dict[str, psutil.Process], prefix: str) -> dict[str, float]:
    cpu0 = _cpu(procs)
    await asyncio.sleep(IDLE_S)
    cpu1 = _cpu(procs)
    rates = {n: (cpu1[n] - cpu0[n]) / IDLE_S for n in cpu0}
    for name, rate in rates.items():
        FIGURES[f"{prefix}idle_cpu_ms_per_s_{name}"] = rate * 1000
    return rates


async def _paced_stack(prefix: str, hooks: dict[str, str] | None) -> None:
    async with full_stack(hooks=hooks) as s:
        idle = await _idle(s.procs, prefix)
        for sessions in LOADS:
            print(
                f"  {time.strftime('%H:%M:%S')} paced{_variant(prefix)}: {sessions} sessions",
                flush=True,
            )
            await _paced(s, sessions, idle, prefix)
        _, total = _store(s.data / "store.db")
        s.stack.stop()  # every block written and compressed before its files are measured
        disk = disk_bytes(s.data, Topology().stream) or disk_bytes(
            s.data / "jetstream", Topology().stream
        )
        FIGURES[f"{prefix}disk_chunks"] = total
        FIGURES[f"{prefix}disk_bytes_per_chunk"] = disk / max(1, total)


def _variant(prefix: str) -> str:
    return ", frames off" if prefix else ""


async def _full_stack_speed(prefix: str, hooks: dict[str, str] | None) -> None:
    print(
        f"  {time.strftime('%H:%M:%S')} full speed{_variant(prefix)}: {FULL_CALLERS} callers",
        flush=True,
    )
    async with full_stack(hooks=hooks) as s:
        url, db = s.stack.nats_url, s.data / "store.db"
        seq0, store0 = await _seqs(url), _store(db)
        _, cpu, _events = await load(
            s.gateway_port, FULL_CALLERS, FULL_EACH, FULL_FRAGMENTS, s.procs
        )
        store1 = await _settled(db, url)
        seq1 = await _seqs(url)
    chunks = max(1, store1[1] - store0[1])
    key = f"{prefix}full"
    FIGURES[f"{key}_chunks"] = chunks
    FIGURES[f"{key}_messages_per_chunk"] = (seq1["chunk_msgs"] - seq0["chunk_msgs"]) / chunks
    FIGURES[f"{key}_stream_bytes_per_chunk"] = (seq1["chunk_bytes"] - seq0["chunk_bytes"]) / chunks
    # the load's CPU window ends when the callers have their last event; the store's catch-up
    # after it is not in it (as in the stack table), so the assembler's figure is a floor
    for name, seconds in cpu.items():
        FIGURES[f"{key}_cpu_us_per_chunk_{name}"] = seconds / chunks * 1e6
    FIGURES[f"{key}_cpu_us_per_chunk_pipeline"] = (
        sum(v for n, v in cpu.items() if n in ("gateway", "assembler", "telemetry", "nats"))
        / chunks
        * 1e6
    )


async def _run(full: bool) -> None:
    load0 = os.getloadavg()
    for prefix, hooks in (("", None), (FRAMES_OFF_PREFIX, FRAMES_OFF)):
        await _paced_stack(prefix, hooks)
        if full:
            await _full_stack_speed(prefix, hooks)
    load1 = os.getloadavg()
    FIGURES["load_avg_1m_start"], FIGURES["load_avg_1m_end"] = load0[0], load1[0]
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    NOTES.append(
        f"{when}; 1-minute load average {load0[0]:.2f} at the start, "
        f"{load1[0]:.2f} at the end, on {os.cpu_count()} cores"
    )


def _table(prefix: str) -> str:
    rows = [
        "| measure | " + " | ".join(f"paced, {n} sessions" for n in LOADS) + " | full speed |",
        "| --- |" + " ---: |" * (len(LOADS) + 1),
    ]
    f = FIGURES.get

    def row(label: str, name: str, fmt: str, full: str | None = None) -> None:
        cells = [fmt.format(f(f"{prefix}s{n}_{name}", float("nan"))) for n in LOADS]
        whole = f"{prefix}full_{full}"
        cells.append(fmt.format(f(whole)) if full and whole in FIGURES else "")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")

    row("chunks/s achieved", "chunks_per_s", "{:,.0f}")
    row(
        "mean step time, s (the provider paces 100 fragments at 50/s: 2.0)",
        "step_seconds",
        "{:.3f}",
    )
    row("chunks per step", "chunks_per_step", "{:.1f}")
    row("broker messages per chunk", "messages_per_chunk", "{:.3f}", "messages_per_chunk")
    row(
        "stream bytes per chunk (state.bytes)",
        "stream_bytes_per_chunk",
        "{:.1f}",
        "stream_bytes_per_chunk",
    )
    for proc in ("gateway", "assembler", "nats"):
        row(f"{proc}: share of a core busy", f"busy_{proc}", "{:.2f}")
    row("step-registry KV writes per step", "kv_writes_per_step", "{:.2f}")
    row("events-stream writes per step", "event_writes_per_step", "{:.2f}")
    for proc in PROCS:
        row(
            f"CPU us per chunk, {proc} (gross)",
            f"cpu_us_per_chunk_{proc}",
            "{:.1f}",
            f"cpu_us_per_chunk_{proc}",
        )
        row(f"CPU us per chunk, {proc} (net of idle)", f"net_cpu_us_per_chunk_{proc}", "{:.1f}")
    row(
        "CPU us per chunk, gateway+assembler+telemetry+nats",
        "cpu_us_per_chunk_pipeline",
        "{:.1f}",
        "cpu_us_per_chunk_pipeline",
    )
    idle = ", ".join(f"{n} {f(f'{prefix}idle_cpu_ms_per_s_{n}', 0.0):.1f}" for n in PROCS)
    disk = f(f"{prefix}disk_bytes_per_chunk", 0.0)
    rows += [
        "",
        f"Idle CPU, ms per second: {idle}. Bytes on disk per chunk with S2 (the stack "
        f"stopped, {f(f'{prefix}disk_chunks', 0):,.0f} chunks): {disk:.1f} B.",
    ]
    return "\n".join(rows)


def main(full: bool = True) -> str:
    """The suite's entry (``python -m bench paced``): the table; FIGURES filled."""
    FIGURES.clear()
    uvloop.run(_run(full))
    return "\n".join(
        (
            _table(""),
            "",
            "The same loads on a fresh stack with frames off (`TOKENWIRE_FRAMES=false`, one v1 "
            "message per chunk: the wire before issue 27), same run:",
            "",
            _table(FRAMES_OFF_PREFIX),
            "",
            NOTES[-1] if NOTES else "",
        )
    )


if __name__ == "__main__":
    print(main())
