"""Frames (issue 27 part 2, ADR 0024): the whole stack with frames off (one v1 message per
chunk, the code before frames), with frames and no linger, and with frames and lingers of
50, 100 and 200 (the default) ms; every variant a fresh stack (``bench._procs.full_stack``:
nats-server, scripted provider, gateway, assembler to SQLite, telemetry, each a process).

Per variant, in one run (``python -m bench frames --no-docs``, ~2 min):

- **paced**: 50 sessions at once, each one step of 100 text fragments at 50 per second (the
  issue's 50 tokens/s per session; starts spread over a second); broker messages per chunk
  and bytes per retained chunk (the stream's own ``messages`` and ``bytes`` before and after,
  the chunks the store committed), and the first chunk's time to the telemetry signal
  (``tw.telemetry.started`` received here, minus the gateway's first-chunk time);
- **full speed**: 50 keep-alive callers, 4 requests each of 200 fragments at full speed
  (``bench_stack.load``, the stack table's "50 callers" row): CPU ms per 1,000 events received
  by every process, and the same bytes and messages per chunk.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import uvloop

from bench import bench_gateway as gw
from bench._procs import full_stack
from bench._suite import pct
from bench.bench_stack import load
from tokenwire.broker import Topology, connect
from tokenwire.schemas import StreamStarted

VARIANTS: tuple[tuple[str, dict[str, str]], ...] = (
    ("v1, frames off", {"TOKENWIRE_FRAMES": "false"}),
    ("frames, linger 0", {"TOKENWIRE_FRAME_LINGER_MS": "0"}),
    ("frames, linger 50 ms", {"TOKENWIRE_FRAME_LINGER_MS": "50"}),
    ("frames, linger 100 ms", {"TOKENWIRE_FRAME_LINGER_MS": "100"}),
    ("frames, linger 200 ms (default)", {}),
)
SESSIONS = 50
FRAGMENTS = 100
RATE = 50
FIGURES: dict[str, float] = {}


@dataclass
class Result:
    name: str
    paced: dict[str, float] = field(default_factory=dict)
    full: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)


async def _stream_state(nats_url: str) -> tuple[int, int]:
    nc = await connect(nats_url)
    try:
        state = (await nc.jetstream().stream_info(Topology().stream)).state
        return state.messages, state.bytes
    finally:
        await nc.close()


async def _committed_chunks(db: Path, at_least: int, timeout_s: float = 60.0) -> int:
    deadline = time.monotonic() + timeout_s
    chunks = 0
    while time.monotonic() < deadline:
        with sqlite3.connect(db) as conn:
            chunks = conn.execute("SELECT coalesce(sum(chunk_count), 0) FROM steps").fetchone()[0]
        if chunks >= at_least:
            return int(chunks)
        await asyncio.sleep(0.3)
    return int(chunks)


async def _paced(port: int, nats_url: str, db: Path) -> tuple[dict[str, float], int]:
    nc = await connect(nats_url)
    arrivals: list[float] = []
    decoder = msgspec.json.Decoder(StreamStarted)

    async def on_signal(msg: object) -> None:
        signal = decoder.decode(msg.data)  # type: ignore[attr-defined]  # a nats Msg
        if signal.session.startswith("paced-"):
            arrivals.append((time.time_ns() - signal.first_chunk_time_ns) / 1e6)

    sub = await nc.subscribe(Topology().telemetry_live_subject, cb=on_signal)
    messages0, bytes0 = await _stream_state(nats_url)
    chunks0 = await _committed_chunks(db, 0)
    options = f"fragments={FRAGMENTS}&rate={RATE}"
    ttfb: list[float] = []

    async def one(i: int) -> None:
        await asyncio.sleep(i / SESSIONS)  # starts spread over a second
        caller = await gw.Caller.open(port)
        req = gw.streaming_request(
            port, "/v1/chat/completions", f"paced-{i}-{time.time_ns()}", options
        )
        first, _ = await caller.stream(req)
        ttfb.append(first * 1000)
        caller.close()

    await asyncio.gather(*(one(i) for i in range(SESSIONS)))
    chunks = await _committed_chunks(db, chunks0 + SESSIONS * FRAGMENTS) - chunks0
    messages1, bytes1 = await _stream_state(nats_url)
    await asyncio.sleep(0.5)  # the last signals
    await sub.unsubscribe()
    await nc.close()
    figures = {
        "chunks": chunks,
        "messages": messages1 - messages0,
        "messages_per_chunk": (messages1 - messages0) / max(1, chunks),
        "bytes_per_chunk": (bytes1 - bytes0) / max(1, chunks),
        "signals": len(arrivals),
        "telemetry_p50_ms": pct(sorted(arrivals), 0.5) if arrivals else 0.0,
        "telemetry_p99_ms": pct(sorted(arrivals), 0.99) if arrivals else 0.0,
        "caller_ttfb_p50_ms": pct(sorted(ttfb), 0.5),
    }
    return figures, chunks0 + chunks


async def _variant(name: str, env: dict[str, str]) -> Result:
    result = Result(name)
    async with full_stack(hooks=env or {"TW_BENCH_NOTHING": "1"}) as s:
        url, db = s.stack.nats_url, s.data / "store.db"
        result.paced, committed = await _paced(s.gateway_port, url, db)
        messages0, bytes0 = await _stream_state(url)
        rate, cpu, events = await load(s.gateway_port, SESSIONS, 4, 200, s.procs)
        chunks = await _committed_chunks(db, committed + events) - committed
        messages1, bytes1 = await _stream_state(url)
        result.full = {
            "events_per_s": rate,
            "events": events,
            "messages_per_chunk": (messages1 - messages0) / max(1, chunks),
            "bytes_per_chunk": (bytes1 - bytes0) / max(1, chunks),
        }
        result.cpu = {n: c / events * 1e6 for n, c in cpu.items()}
        result.cpu["total"] = sum(cpu.values()) / events * 1e6
    return result


async def _run() -> list[Result]:
    out = []
    for name, env in VARIANTS:
        print(f"  {time.strftime('%H:%M:%S')} {name}", flush=True)
        out.append(await _variant(name, env))
    return out


def _table(results: list[Result]) -> str:
    base = results[0]
    head = "| measure | " + " | ".join(r.name for r in results) + " |"
    rows = [head, "| --- |" + " ---: |" * len(results)]

    def row(label: str, values: list[float], fmt: str = "{:,.2f}") -> None:
        rows.append(f"| {label} | " + " | ".join(fmt.format(v) for v in values) + " |")

    row(
        "paced 50 x 50 tok/s: broker messages per chunk",
        [r.paced["messages_per_chunk"] for r in results],
        "{:.3f}",
    )
    row("paced: bytes per retained chunk", [r.paced["bytes_per_chunk"] for r in results], "{:,.0f}")
    row(
        "paced: first chunk -> telemetry signal p50, ms",
        [r.paced["telemetry_p50_ms"] for r in results],
    )
    row(
        "paced: first chunk -> telemetry signal p99, ms",
        [r.paced["telemetry_p99_ms"] for r in results],
    )
    row("paced: caller first byte p50, ms", [r.paced["caller_ttfb_p50_ms"] for r in results])
    row("full speed 50 callers: events/s", [r.full["events_per_s"] for r in results], "{:,.0f}")
    row(
        "full speed: broker messages per chunk",
        [r.full["messages_per_chunk"] for r in results],
        "{:.3f}",
    )
    row(
        "full speed: bytes per retained chunk",
        [r.full["bytes_per_chunk"] for r in results],
        "{:,.0f}",
    )
    for proc in ("gateway", "assembler", "telemetry", "nats", "scripted-provider", "load", "total"):
        if all(proc in r.cpu for r in results):
            row(f"CPU ms per 1,000 events, {proc}", [r.cpu[proc] for r in results], "{:.1f}")
    rows.append("")
    rows.append(
        "Same-run ratios against frames off (v1): "
        + "; ".join(
            f"{r.name}: CPU {base.cpu['total'] / r.cpu['total']:.2f}x lower, paced bytes/chunk "
            f"{base.paced['bytes_per_chunk'] / r.paced['bytes_per_chunk']:.2f}x lower"
            for r in results[1:]
        )
    )
    return "\n".join(rows)


def main() -> str:
    results = uvloop.run(_run())
    for r in results:
        key = r.name.split(",")[-1].strip().replace(" ", "_")
        for group, values in (("paced", r.paced), ("full", r.full), ("cpu", r.cpu)):
            for k, v in values.items():
                FIGURES[f"{key}_{group}_{k}"] = float(v)
    return _table(results)


if __name__ == "__main__":
    print(main())
