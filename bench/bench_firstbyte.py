"""The first byte as a user would compare it (issue 47): ``make bench BENCH=firstbyte``.

The whole stack as ``tokenwire up`` runs it (nats-server, scripted provider, gateway,
assembler to SQLite, telemetry: every chunk durable), LiteLLM's proxy (one worker, its own
venv: ``bench/_peer.py``) and the direct call, all in front of the stack's one scripted
provider, which sends its first token :data:`FIRST_TOKEN_S` after the request and then
:data:`FRAGMENTS` chunks at full speed. Each side is a lone caller on one keep-alive
connection, one request at a time and a new session per request (``X-Tokenwire-Session``):
the three sides take turns request by request, the order rotated each time (on a shared
machine, sides measured minutes apart meet different loads), :data:`REQUESTS` requests per
side in each of :data:`ROUNDS` rounds. Time to first body byte per request.

*Added* first byte, the issue's method: a side's percentile minus the direct call's
percentile in the same round (p50 and p99), and tokenwire's over LiteLLM's; the figures
reported are the medians of the rounds. The same run also measures the method of
``bench_stack``'s 50 ms row once (docs/benchmarks.md, "Two methods"): per-pair differences of
alternating direct and through requests, one session, 8 fragments paced at 50/s, a random
pause between pairs.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import uvloop

from bench import _peer
from bench import bench_gateway as gw
from bench._procs import RunningStack, full_stack
from bench._suite import pct
from tokenwire.broker import free_port

ROUNDS = 3
REQUESTS = 120
"""Requests per side and round (after :data:`WARM` of each side's first round's requests)."""
WARM = 5
FIRST_TOKEN_S = 0.05
FRAGMENTS = 200
OPTIONS = f"fragments={FRAGMENTS}&first={FIRST_TOKEN_S}"
PAIRED_OPTIONS = f"fragments=8&rate={gw.RATE_D}&first={FIRST_TOKEN_S}"
"""``bench_stack``'s 50 ms row: what ``bench_ttfc`` asks for."""
PAIRS = 100
TARGET = 0.10
SIDES = ("direct", "tokenwire", "litellm")
FIGURES: dict[str, float] = {}
BEFORE = os.environ.get("BENCH_FIRSTBYTE_BEFORE", "")
"""A ``src`` directory of other code (``git archive <rev> src``): its gateway joins the same
stack as the side ``before`` (same broker, same provider), for a same-run A/B."""
_PATH = "/v1/chat/completions"


@dataclass
class Round:
    """One round's first bytes, ms, by side."""

    firsts: dict[str, list[float]] = field(default_factory=dict)

    def added(self, side: str, q: float) -> float:
        """``side``'s quantile ``q`` over the direct call's, ms."""
        return pct(self.firsts[side], q) - pct(self.firsts["direct"], q)


def _progress(what: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


async def _lone(port: int, n: int, tag: str) -> list[float]:
    """``n`` requests back to back on one keep-alive connection, a new session each: ms to
    the first body bytes."""
    caller = await gw.Caller.open(port)
    firsts = []
    try:
        for _ in range(n):
            session = f"fb-{tag}-{uuid.uuid4().hex}"
            first, _ = await caller.stream(gw.streaming_request(port, _PATH, session, OPTIONS))
            firsts.append(first * 1000)
    finally:
        caller.close()
    return firsts


async def _rounds(ports: dict[str, int], rounds: int, n: int) -> list[Round]:
    """``rounds`` rounds of ``n`` requests per side: one request at a time, the sides
    taking turns request by request (the order rotated each time), so that every side
    meets the machine's load alike."""
    for side, port in ports.items():  # each side's connections and caches warm
        await _lone(port, WARM, f"warm-{side}")
    sides, done = list(ports), []
    for r in range(rounds):
        _progress(f"round {r + 1} of {rounds}: {n} requests per side, turns rotated")
        callers = {side: await gw.Caller.open(port) for side, port in ports.items()}
        one = Round({side: [] for side in sides})
        for i in range(n):
            k = (i + r) % len(sides)
            for side in sides[k:] + sides[:k]:
                session = f"fb-{r}-{side}-{uuid.uuid4().hex}"
                request = gw.streaming_request(ports[side], _PATH, session, OPTIONS)
                try:
                    first, _ = await callers[side].stream(request)
                except RuntimeError:  # the side closed its keep-alive connection: not timed
                    FIGURES[f"{side}_reconnects"] = FIGURES.get(f"{side}_reconnects", 0) + 1
                    callers[side].close()
                    callers[side] = await gw.Caller.open(ports[side])
                    continue
                one.firsts[side].append(first * 1000)
        for caller in callers.values():
            caller.close()
        done.append(one)
    return done


async def _paired(sp_port: int, port: int, n: int) -> tuple[float, float]:
    """``bench_stack``'s method: p50 and p99 of the per-pair differences, ms."""
    pairs = await gw.bench_ttfc(sp_port, port, 1, n, FIRST_TOKEN_S)
    added = [(g - d) * 1000 for d, g in pairs]
    return pct(added, 0.5), pct(added, 0.99)


def _record(rounds: list[Round]) -> None:
    sides = list(rounds[0].firsts)
    for i, one in enumerate(rounds, 1):
        for side in sides:
            for q in (50, 99):
                FIGURES[f"r{i}_{side}_p{q}_ms"] = pct(one.firsts[side], q / 100)
    for side in sides[1:]:
        for q in (50, 99):
            FIGURES[f"{side}_added_p{q}_ms"] = statistics.median(
                one.added(side, q / 100) for one in rounds
            )
            if "litellm" in sides and side != "litellm":
                ratios = [_ratio(one, side, q / 100) for one in rounds]
                FIGURES[f"{side}_ratio_p{q}"] = statistics.median(ratios)
                FIGURES[f"{side}_ratio_p{q}_min"] = min(ratios)
                FIGURES[f"{side}_ratio_p{q}_max"] = max(ratios)
    for side in sides[1:]:  # the same samples, bench_stack's statistic: per-pair differences
        for q in (50, 99):
            FIGURES[f"{side}_pairwise_p{q}_ms"] = statistics.median(
                pct(_differences(one.firsts["direct"], one.firsts[side]), q / 100) for one in rounds
            )
    FIGURES["rounds"] = len(rounds)
    FIGURES["requests_per_side_and_round"] = min(len(one.firsts["direct"]) for one in rounds)


def _differences(direct: list[float], through: list[float]) -> list[float]:
    """Per-turn differences (a reconnect may leave a side one sample short)."""
    return [t - d for d, t in zip(direct, through, strict=False)]


def _ratio(one: Round, side: str, q: float) -> float:
    """``side``'s added first byte over LiteLLM's at quantile ``q``, in one round."""
    return one.added(side, q) / one.added("litellm", q)


async def _before(s: RunningStack) -> tuple[int, subprocess.Popen[bytes]]:
    """A second gateway on the stack's broker, run from :data:`BEFORE`'s code."""
    child = next(c for c in s.stack.children if c.name == "gateway")
    port = free_port()
    env = {**os.environ, **child.env, "PYTHONPATH": BEFORE}
    env["TOKENWIRE_GATEWAY_ADDR"] = f"127.0.0.1:{port}"
    proc = subprocess.Popen(  # noqa: ASYNC220 - bench start-up, not a hot path
        [sys.executable, "-m", "tokenwire", *child.argv],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    await gw._wait_up(port, 60.0)
    return port, proc


async def _run(rounds: int, n: int, pairs: int, peer: bool) -> None:
    exe = await asyncio.to_thread(_peer.ensure_installed) if peer else "--no-peer"
    async with full_stack() as s:
        ports = {"direct": s.scripted_port, "tokenwire": s.gateway_port}
        if BEFORE:
            ports["before"], proc = await _before(s)
        try:
            await _sides(s, ports, exe, rounds, n, pairs)
        finally:
            if BEFORE:
                proc.terminate()
                proc.wait(20)


async def _sides(
    s: RunningStack, ports: dict[str, int], exe: Path | str, rounds: int, n: int, pairs: int
) -> None:
    """The rounds over ``ports`` and, with the peer installed (``exe``), LiteLLM too, then
    ``bench_stack``'s method for each side but the direct call."""
    if isinstance(exe, str):
        _progress(f"peer skipped: {exe}")
        _record(await _rounds(ports, rounds, n))
        return
    options = [OPTIONS, PAIRED_OPTIONS]
    async with _peer.litellm_proxy(exe, s.scripted_port, options) as (peer_port, _):
        ports["litellm"] = peer_port
        _record(await _rounds(ports, rounds, n))
        _progress("bench_stack's method (paired), side by side")
        for side in list(ports)[1:]:
            p50, p99 = await _paired(s.scripted_port, ports[side], pairs)
            FIGURES[f"paired_{side}_added_p50_ms"] = p50
            FIGURES[f"paired_{side}_added_p99_ms"] = p99


TIMELINE = (
    ("app_entry", "caller's request -> gateway app (loopback hop, HTTP parse, ASGI)"),
    ("body_read", "request body read"),
    ("thread_start", "JSON decode, dialect parse, identity headers, routing, provider body"),
    ("thread_done", "session threading (no read: a named session)"),
    ("admit_done", "owner check (inactive without tenants)"),
    ("provider_post", "-> provider request written"),
    ("claim_start", "-> the step's claim"),
    ("claim_sent", "step claim's writes handed to the broker connection"),
    ("step_begin", "step set-up (span, output, run), beside the provider"),
    ("first_read_done", "provider: headers, first token, first body bytes read"),
    ("first_take", "first bytes parsed and normalised into chunks"),
    ("claim_wait", "-> the step's identity asked for"),
    ("claim_known", "claim's answer (already in: the provider took longer)"),
    ("first_publish", "first chunk framed"),
    ("first_published", "first chunk handed to the publisher (no ack awaited)"),
    ("first_outbox_put", "caller's opening and first event encoded"),
    ("step_begun", "first bytes in the outbox"),
    ("response_call", "step task started, response built and called"),
    ("first_body_send", "response head sent, first body write asked"),
    ("first_body_sent", "uvicorn's body write"),
    ("caller", "-> caller's first byte (loopback hop, wake-up)"),
)
"""The timeline's marks, in the order a request reaches them (bench/_hooked_gateway.py), and
what happens between the previous mark and each."""


async def _timeline(n: int) -> None:
    """The issue's method against a stack whose gateway records timing marks: p50 of each
    phase (``timeline_<mark>_p50_ms``), and the direct call's first byte beside it."""
    with tempfile.TemporaryDirectory() as tmp:
        marks = Path(tmp) / "marks.jsonl"
        async with full_stack(hooks={"TW_BENCH_MARKS": str(marks)}) as s:
            await _lone(s.gateway_port, WARM, "warm-marks")
            await asyncio.to_thread(marks.write_text, "")
            caller = await gw.Caller.open(s.gateway_port)
            sent: list[tuple[float, float]] = []
            for i in range(n):
                request = gw.streaming_request(s.gateway_port, _PATH, f"fb-marks-{i}", OPTIONS)
                at = time.perf_counter()
                first, _ = await caller.stream(request)
                sent.append((at, at + first))
            caller.close()
            direct = await _lone(s.scripted_port, n, "marks-direct")
            text = await asyncio.to_thread(marks.read_text)
    phases: dict[str, list[float]] = {name: [] for name, _ in TIMELINE}
    provider: list[float] = []
    chunks: list[float] = []
    for (at, first), line in zip(sent, text.splitlines(), strict=False):
        m = {**json.loads(line), "caller": first}
        previous = at
        for name, _ in TIMELINE:
            phases[name].append((m[name] - previous) * 1000)
            previous = m[name]
        provider.append((m["first_read_done"] - m["provider_post"]) * 1000)
        chunks.append(m["first_read_chunks"])
    for name, values in phases.items():
        FIGURES[f"timeline_{name}_p50_ms"] = pct(values, 0.5)
    FIGURES["timeline_total_p50_ms"] = pct([(b - a) * 1000 for a, b in sent], 0.5)
    FIGURES["timeline_provider_p50_ms"] = pct(provider, 0.5)
    FIGURES["timeline_direct_p50_ms"] = pct(direct, 0.5)
    FIGURES["timeline_requests"] = len(provider)
    FIGURES["timeline_first_read_chunks_p50"] = pct(chunks, 0.5)


def timeline_table() -> str:
    """The per-phase timeline of one request (p50 of each phase over the run's requests)."""
    f = FIGURES
    rows = [
        f"One request's phases, p50 of {int(f['timeline_requests'])} lone requests (the "
        "issue's method, gateway timing marks; phases between the provider request and its "
        "first bytes run beside the provider):",
        "",
        "| phase (ends at mark) | ms, p50 |",
        "| --- | ---: |",
    ]
    rows += [
        f"| {what} (`{name}`) | {f[f'timeline_{name}_p50_ms']:.3f} |" for name, what in TIMELINE
    ]
    rows += [
        f"| whole first byte, p50 | {f['timeline_total_p50_ms']:.2f} |",
        f"| of which the provider (request written -> first bytes read), p50 | "
        f"{f['timeline_provider_p50_ms']:.2f} |",
        f"| the direct call's first byte, p50 (same stack, after) | "
        f"{f['timeline_direct_p50_ms']:.2f} |",
    ]
    return "\n".join(rows)


_NAMES = {
    "direct": "direct",
    "tokenwire": "tokenwire",
    "before": "before (BENCH_FIRSTBYTE_BEFORE)",
    "litellm": "LiteLLM",
}


def _sides_run() -> list[str]:
    return [
        side
        for side in ("direct", "tokenwire", "before", "litellm")
        if f"r1_{side}_p50_ms" in FIGURES
    ]


def rounds_table() -> str:
    """The rounds: each side's first byte, the added figures and their ratio to LiteLLM's."""
    f, sides = FIGURES, _sides_run()
    rounds = int(f["rounds"])
    rows = [
        f"Issue 47's method: a lone caller, a new session per request, {FRAGMENTS} chunks after "
        f"a {FIRST_TOKEN_S * 1000:.0f} ms first token, {int(f['requests_per_side_and_round'])} "
        f"requests per side and round, {rounds} rounds; added = the side's percentile minus "
        "the direct call's, same round.",
        "",
        "| round | " + " | ".join(f"{_NAMES[side]} p50 / p99 ms" for side in sides) + " |",
        "| --- |" + " ---: |" * len(sides),
    ]
    for i in range(1, rounds + 1):
        cells = [
            f"{f[f'r{i}_{side}_p50_ms']:.2f} / {f[f'r{i}_{side}_p99_ms']:.2f}" for side in sides
        ]
        rows.append(f"| {i} | {' | '.join(cells)} |")
    rows += ["", "| added first byte, median of the rounds | p50 | p99 |", "| --- | ---: | ---: |"]
    for side in sides[1:]:
        cells = [f"+{f[f'{side}_added_p{q}_ms']:.2f} ms" for q in (50, 99)]
        rows.append(f"| {_NAMES[side]} | {' | '.join(cells)} |")
    rows += [
        "",
        "| the same samples, bench_stack's statistic (per-pair differences, a pair = one turn) "
        "| p50 | p99 |",
        "| --- | ---: | ---: |",
    ]
    for side in sides[1:]:
        cells = [f"+{f[f'{side}_pairwise_p{q}_ms']:.2f} ms" for q in (50, 99)]
        rows.append(f"| {_NAMES[side]} | {' | '.join(cells)} |")
    if "litellm" in sides:
        rows += ["", "| ratio to LiteLLM's added first byte, median (rounds' range) | p50 | p99 |"]
        rows.append("| --- | ---: | ---: |")
        for side in sides[1:-1]:
            cells = [
                f"**{f[f'{side}_ratio_p{q}']:.3f}x** ({f[f'{side}_ratio_p{q}_min']:.3f}-"
                f"{f[f'{side}_ratio_p{q}_max']:.3f})"
                for q in (50, 99)
            ]
            rows.append(f"| {_NAMES[side]} (target <= {TARGET:.2f}x) | {' | '.join(cells)} |")
    return "\n".join(rows)


def paired_table() -> str:
    """``bench_stack``'s method in the same run, when it ran."""
    f = FIGURES
    sides = [
        side for side in ("tokenwire", "before", "litellm") if f"paired_{side}_added_p50_ms" in f
    ]
    if "litellm" not in sides:
        return ""
    rows = [
        "bench_stack's method in the same run (p50 and p99 of per-pair differences, one "
        f"session, 8 fragments paced at 50/s, a random pause between pairs; {PAIRS} pairs):",
        "",
        "| added first byte | p50 | p99 | ratio to LiteLLM's, p50 / p99 |",
        "| --- | ---: | ---: | ---: |",
    ]
    peer = [f[f"paired_litellm_added_p{q}_ms"] for q in (50, 99)]
    for side in sides:
        mine = [f[f"paired_{side}_added_p{q}_ms"] for q in (50, 99)]
        rows.append(
            f"| {_NAMES[side]} | +{mine[0]:.2f} ms | +{mine[1]:.2f} ms | "
            f"{mine[0] / peer[0]:.3f}x / {mine[1] / peer[1]:.3f}x |"
        )
    return "\n".join(rows)


def table() -> str:
    """The run's tables from :data:`FIGURES`."""
    parts = [rounds_table(), paired_table()]
    if "timeline_requests" in FIGURES:
        parts.append(timeline_table())
    return "\n\n".join(part for part in parts if part)


def main(
    rounds: int = ROUNDS, n: int = REQUESTS, pairs: int = PAIRS, peer: bool = True, marks: int = 100
) -> str:
    """Run the rounds (and, with the peer, the paired method), then the timeline; the tables."""
    FIGURES.clear()
    uvloop.run(_run(rounds, n, pairs, peer))
    if marks:
        _progress("the timeline: a stack whose gateway records timing marks")
        uvloop.run(_timeline(marks))
    return table()


if __name__ == "__main__":
    print(main())
