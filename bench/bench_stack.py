"""tokenwire on the whole stack as ``tokenwire up`` runs it, beside the peer, same scenarios.

Every variant starts a fresh stack (``bench._procs.full_stack``: nats-server, scripted
provider, gateway, assembler to SQLite, telemetry, each its own process):

- ``full``: the whole stack; ``bare``: without the assembler and telemetry consumer;
- ``aiohttp``: the whole stack, the gateway's provider calls through aiohttp (ADR 0009's test);
- ``marks``: the whole stack, the gateway timing each phase of a lone caller's request;
- ``v1``: the whole stack with frames off (``TOKENWIRE_FRAMES=false``: one v1 message per
  chunk, the wire before frames, ADR 0024), the same build: the "today" of issue 27's CPU and
  bytes targets, measured in the same run (the paced load and 50 callers at full speed only).

Scenarios, the same for tokenwire, the peer and the direct call: a lone sequential caller and
50 concurrent paced callers (8 fragments at 50/s), pairs alternating direct and through, added
time to first body byte per pair; chunks/s of 1 and of 50 callers at full speed (200
fragments), counting the ``data:`` events each caller receives, and every process's CPU.
Bytes per retained chunk (``full`` and ``v1``): the chunk stream's own ``bytes`` (payload,
subject, headers, JetStream's per-message record) over the chunks its new messages carry, for
the 50 callers at full speed and for a paced load (:data:`PACED_SESSIONS` sessions at once,
one step each at :data:`PACED_RATE` fragments per second, the issue's 50 tokens/s).
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import uvloop

from bench import _peer
from bench import bench_gateway as gw
from bench._procs import RunningStack, cpu_s, full_stack, scripted_and_proxy
from bench._suite import Figures, Profile, pct, sizes
from tokenwire.broker import Topology, connect, read_range
from tokenwire.schemas import chunk_envelopes

PHASE = "stack"
PEER = "peer"
PACED = f"fragments=8&rate={gw.RATE_D}"
CALLERS = 50
FRAMES_OFF = {"TOKENWIRE_FRAMES": "false"}
"""The ``v1`` variant's gateway: every chunk its own v1 message, as before frames."""
PACED_SESSIONS = 50
PACED_RATE = 50
"""The paced retention load: this many sessions at once, one step each at this many fragments
per second (issue 27's 50 tokens/s per session); 100 fragments a step (smoke: 20)."""
FIRST_TOKEN_S = 0.05
"""The ``ttft`` scenario's provider time to first token: a lone caller as against a model that
takes 50 ms to its first token (real ones take 0.2-1 s), so the step claim's round trip runs
wholly beside the provider."""


def _progress(what: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


async def _events(caller: gw.Caller, request: bytes) -> int:
    caller.writer.write(request)
    data = bytearray()  # grows in place: a peer's many small writes stay linear to read
    while not data.endswith(b"\r\n0\r\n\r\n"):
        data += await caller._read()
    if not data.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"not streamed: {bytes(data[:300])!r}")
    return data.count(b"data: ")


async def load(
    port: int, callers: int, each: int, fragments: int, procs: dict[str, psutil.Process]
) -> tuple[float, dict[str, float], int]:
    """``callers`` keep-alive callers, ``each`` full-speed requests one after another:
    (events/s received, CPU s per process, events)."""
    conns = await asyncio.gather(*(gw.Caller.open(port) for _ in range(callers)))
    path = "/v1/chat/completions"

    async def one(i: int, c: gw.Caller) -> int:
        total = 0
        for k in range(each):
            req = gw.streaming_request(
                port, path, f"ld{time.monotonic_ns()}-{i}-{k}", f"fragments={fragments}"
            )
            total += await _events(c, req)
        return total

    await asyncio.gather(*(one(i, c) for i, c in enumerate(conns[:1])))  # warm-up
    before = {n: cpu_s(p) for n, p in procs.items()}
    started = time.perf_counter()
    events = sum(await asyncio.gather(*(one(i, c) for i, c in enumerate(conns))))
    elapsed = time.perf_counter() - started
    cpu = {n: cpu_s(p) - before[n] for n, p in procs.items()}
    for c in conns:
        c.close()
    return events / elapsed, cpu, events


async def _stream_mark(nats_url: str) -> tuple[int, int]:
    """(last sequence, bytes) of the chunk stream now."""
    nc = await connect(nats_url)
    try:
        state = (await nc.jetstream().stream_info(Topology().stream)).state
        return state.last_seq, state.bytes
    finally:
        await nc.close()


async def _put_retained(fig: Figures, name: str, nats_url: str, mark: tuple[int, int]) -> None:
    """``<name>_bytes_per_chunk`` and ``<name>_messages_per_chunk`` of what the stream took
    since ``mark`` (chunks counted from the messages themselves: a frame carries several)."""
    last, stored = await _stream_mark(nats_url)
    messages = chunks = 0
    if last > mark[0]:
        nc = await connect(nats_url)
        try:
            t = Topology()
            async for _, payload in read_range(
                nc, t.stream, f"{t.prefix}.chunks.>", mark[0] + 1, last=last
            ):
                messages += 1
                chunks += len(chunk_envelopes(payload))
        finally:
            await nc.close()
    fig.put(PHASE, f"{name}_bytes_per_chunk", (stored - mark[1]) / max(1, chunks))
    fig.put(PHASE, f"{name}_messages_per_chunk", messages / max(1, chunks))


async def paced_retention(
    fig: Figures, prefix: str, port: int, nats_url: str, profile: Profile
) -> None:
    """Bytes and broker messages per retained chunk of :data:`PACED_SESSIONS` paced sessions
    at once (starts spread over a second), one step each: ``<prefix>_paced_...``."""
    sessions, fragments = (
        sizes(profile, 5, PACED_SESSIONS, PACED_SESSIONS),
        sizes(profile, 20, 100, 100),
    )
    mark = await _stream_mark(nats_url)
    options = f"fragments={fragments}&rate={PACED_RATE}"

    async def one(i: int) -> None:
        await asyncio.sleep(i / sessions)
        caller = await gw.Caller.open(port)
        request = gw.streaming_request(
            port, "/v1/chat/completions", f"paced-{i}-{time.time_ns()}", options
        )
        try:
            await caller.stream(request)
        finally:
            caller.close()

    await asyncio.gather(*(one(i) for i in range(sessions)))
    await _put_retained(fig, f"{prefix}_paced", nats_url, mark)


def _put_pairs(fig: Figures, phase: str, tag: str, pairs: list[tuple[float, float]]) -> None:
    direct = [d * 1000 for d, _ in pairs]
    through = [g * 1000 for _, g in pairs]
    added = [(g - d) * 1000 for d, g in pairs]
    for q in (50, 99):
        fig.put(phase, f"{tag}_direct_p{q}_ms", pct(direct, q / 100))
        fig.put(phase, f"{tag}_through_p{q}_ms", pct(through, q / 100))
        fig.put(phase, f"{tag}_added_p{q}_ms", pct(added, q / 100))


async def scenarios(
    fig: Figures,
    phase: str,
    prefix: str,
    *,
    port: int,
    sp_port: int,
    procs: dict[str, psutil.Process],
    profile: Profile,
    throughput: bool = True,
    ttft: bool = False,
    nats_url: str | None = None,
) -> None:
    """The shared scenarios against ``port``, figures named ``<prefix>_...``; ``ttft``: also
    the lone caller against a provider with a time to first token (:data:`FIRST_TOKEN_S`);
    ``nats_url``: also the bytes per retained chunk of the 50 callers' load."""
    serial, pairs = sizes(profile, 5, 100, 200), sizes(profile, 2, 8, 20)
    hot_callers = sizes(profile, 5, CALLERS, CALLERS)
    _put_pairs(fig, phase, f"{prefix}_lone", await gw.bench_ttfc(sp_port, port, 1, serial))
    if ttft:
        slow = await gw.bench_ttfc(sp_port, port, 1, serial, FIRST_TOKEN_S)
        _put_pairs(fig, phase, f"{prefix}_ttft", slow)
    _put_pairs(fig, phase, f"{prefix}_hot", await gw.bench_ttfc(sp_port, port, hot_callers, pairs))
    if not throughput:
        return
    at = {"port": port, "procs": procs, "profile": profile}
    await throughput_at(fig, phase, f"{prefix}_c1", callers=1, **at)
    await throughput_at(fig, phase, f"{prefix}_cmany", callers=hot_callers, nats_url=nats_url, **at)


async def throughput_at(
    fig: Figures,
    phase: str,
    tag: str,
    *,
    port: int,
    callers: int,
    procs: dict[str, psutil.Process],
    profile: Profile,
    nats_url: str | None = None,
) -> None:
    """``callers`` at full speed (200 fragments a request): events/s and every process's CPU
    per 1,000 events as ``<tag>_...``; with ``nats_url``, the bytes per retained chunk too."""
    # /proc counts CPU in 10 ms ticks: the smoke sizes give each process tens of ms to count
    # (one request per caller gave the gateway ~11 ms, which read as 0 ticks under load)
    each = sizes(profile, 8, 20, 50) if callers == 1 else sizes(profile, 4, 4, 10)
    mark = await _stream_mark(nats_url) if nats_url else None
    rate, cpu, events = await load(port, callers, each, 200, procs)
    fig.put(phase, f"{tag}_events_per_s", rate)
    fig.put(phase, f"{tag}_callers", callers)
    for name, seconds in cpu.items():
        fig.put(phase, f"{tag}_cpu_ms_per_1k_{name}", seconds / events * 1e6)
    fig.put(phase, f"{tag}_cpu_ms_per_1k_total", sum(cpu.values()) / events * 1e6)
    if nats_url and mark:
        await _put_retained(fig, tag, nats_url, mark)


async def _durability(fig: Figures, data: Path, nats_url: str) -> None:
    """Provider byte -> store commit from the store's own columns (``completed_ns``: the
    gateway's receipt of the step's last provider chunk; ``committed_ns``: the commit), and
    telemetry deliveries per step; after the assembler caught up (bounded)."""
    nc = await connect(nats_url)
    t = Topology()
    stream = await nc.jetstream().stream_info(t.stream)
    on_stream = 0  # chunks, not messages: a frame carries several (ADR 0024)
    if stream.state.messages:
        async for _, payload in read_range(
            nc, t.stream, f"{t.prefix}.chunks.>", 1, last=stream.state.last_seq
        ):
            on_stream += len(chunk_envelopes(payload))
    db = data / "store.db"
    deadline = time.monotonic() + 60
    rows: list[tuple[int, int]] = []
    while time.monotonic() < deadline:
        with sqlite3.connect(db) as conn:
            rows = conn.execute("SELECT completed_ns, committed_ns FROM steps").fetchall()
            chunks = conn.execute("SELECT coalesce(sum(chunk_count), 0) FROM steps").fetchone()[0]
        if chunks >= on_stream:
            break
        await asyncio.sleep(0.5)
    info = await nc.jetstream().consumer_info(t.stream, t.telemetry_consumer)
    await nc.close()
    lat = [(c - d) / 1e6 for d, c in rows]
    fig.put(PHASE, "steps_committed", len(rows))
    fig.put(PHASE, "chunks_on_stream", on_stream)
    fig.put(PHASE, "messages_on_stream", stream.state.messages)
    fig.put(PHASE, "chunks_committed", chunks)
    for q in (50, 90, 99):
        fig.put(PHASE, f"e2e_provider_to_commit_p{q}_ms", pct(lat, q / 100) if lat else 0.0)
    fig.put(PHASE, "telemetry_deliveries_per_step", info.delivered.consumer_seq / max(1, len(rows)))


PHASES = (
    "caller_to_app",
    "app_to_claim",
    "claim_to_provider_post",
    "provider_post_to_wait",
    "provider_wait_to_headers",
    "headers_to_first_read",
    "first_read_to_claim_wait",
    "claim_wait",
    "claim_to_publish",
    "publish_to_first_send",
    "send_to_caller",
)


async def _marked_lone(fig: Figures, port: int, marks: Path, n: int) -> None:
    """The breakdown of a lone caller's time to first byte, from the gateway's marks."""
    caller = await gw.Caller.open(port)
    sides: list[tuple[float, float]] = []
    for i in range(n + 1):
        req = gw.streaming_request(port, "/v1/chat/completions", "marked", PACED)
        t_send = time.perf_counter()
        first, _ = await caller.stream(req)
        if i:
            sides.append((t_send, t_send + first))
        await asyncio.sleep(0.02)
    caller.close()
    text = await asyncio.to_thread(marks.read_text)
    lines = [json.loads(x) for x in text.splitlines()][1 : n + 1]
    parts: dict[str, list[float]] = {p: [] for p in PHASES}
    for (t_send, t_first), m in zip(sides, lines, strict=False):
        points = [
            t_send,
            m.get("app_entry"),
            m.get("claim_start", m.get("app_entry")),
            m.get("provider_post"),
            m.get("provider_wait"),
            m.get("provider_headers"),
            m.get("first_read_done"),
            m.get("claim_wait"),
            m.get("claim_known"),
            m.get("first_publish"),
            m.get("first_body_send"),
            t_first,
        ]
        if any(p is None for p in points):
            continue
        for name, a, b in zip(PHASES, points, points[1:], strict=False):
            parts[name].append((b - a) * 1000)
    for name, values in parts.items():
        if values:
            fig.put(PHASE, f"marks_{name}_p50_ms", pct(values, 0.5))
    fig.put(PHASE, "marks_requests", min(len(v) for v in parts.values()))


async def _stack_variants(fig: Figures, profile: Profile) -> None:
    _progress("full stack (assembler + telemetry)")
    async with full_stack(shared=True) as s:  # interleaved's too, with the smoke profile
        url = s.stack.nats_url
        await scenarios(fig, PHASE, "full", ttft=True, nats_url=url, **_ports(s, profile))
        await paced_retention(fig, "full", s.gateway_port, url, profile)
        await _durability(fig, s.data, url)
    await _frames_off_variant(fig, profile)
    if profile == "smoke":  # seconds: the whole stack, frames off and the marks only
        await _marks_variant(fig, profile)
        return
    _progress("stack without assembler and telemetry")
    async with full_stack(consumers=False) as s:
        await scenarios(fig, PHASE, "bare", **_ports(s, profile))
    _progress("full stack, provider calls through aiohttp (ADR 0009)")
    async with full_stack(hooks={"TW_BENCH_CLIENT": "aiohttp"}) as s:
        await scenarios(fig, PHASE, "aiohttp", throughput=False, **_ports(s, profile))
    await _marks_variant(fig, profile)


def _ports(s: RunningStack, profile: Profile) -> dict[str, Any]:
    """A running stack's ports and processes, as :func:`scenarios` takes them."""
    return {
        "port": s.gateway_port,
        "sp_port": s.scripted_port,
        "procs": s.procs,
        "profile": profile,
    }


async def _frames_off_variant(fig: Figures, profile: Profile) -> None:
    """The same build with frames off: the paced load (which also opens the 50 callers'
    provider connections, as the full stack's paced callers do before its full-speed load),
    then the 50 callers at full speed."""
    _progress("full stack, frames off (the wire before frames, issue 27's baseline)")
    async with full_stack(hooks=FRAMES_OFF, shared=True) as s:
        url = s.stack.nats_url
        await paced_retention(fig, "v1", s.gateway_port, url, profile)
        callers = sizes(profile, 5, CALLERS, CALLERS)
        await throughput_at(
            fig,
            PHASE,
            "v1_cmany",
            port=s.gateway_port,
            callers=callers,
            procs=s.procs,
            profile=profile,
            nats_url=url,
        )


async def _marks_variant(fig: Figures, profile: Profile) -> None:
    _progress("full stack, gateway timing marks")
    with tempfile.TemporaryDirectory() as tmp:
        marks = Path(tmp) / "marks.jsonl"
        async with full_stack(hooks={"TW_BENCH_MARKS": str(marks)}) as s:
            await _marked_lone(fig, s.gateway_port, marks, sizes(profile, 5, 40, 100))


async def _peer_run(fig: Figures, profile: Profile) -> None:
    exe = await asyncio.to_thread(_peer.ensure_installed)
    if isinstance(exe, str):
        fig.notes[PEER] = f"peer skipped: {exe}"
        print(f"  {fig.notes[PEER]}", file=sys.stderr, flush=True)
        return
    async with scripted_and_proxy() as (sp_port, _, side):
        options = [PACED, f"{PACED}&first={FIRST_TOKEN_S}", "fragments=200"]
        async with _peer.litellm_proxy(exe, sp_port, options) as (port, proc):
            procs = {"litellm": proc, "scripted": side["scripted"], "load": side["load"]}
            await scenarios(
                fig,
                PEER,
                "litellm",
                port=port,
                sp_port=sp_port,
                procs=procs,
                profile=profile,
                ttft=True,
            )
    fig.notes[PEER] = f"LiteLLM {_peer.VERSION} proxy, one worker"


def run(fig: Figures, profile: Profile, peer: bool = True) -> str:
    uvloop.run(_stack_variants(fig, profile))
    if peer:
        _progress("peer: LiteLLM proxy")
        uvloop.run(_peer_run(fig, profile))
    else:
        fig.notes[PEER] = "peer skipped: --no-peer"
    return table(fig)


def table(fig: Figures) -> str:
    from bench._report import stack_table

    return stack_table(fig)


__all__ = ["Any", "run"]
