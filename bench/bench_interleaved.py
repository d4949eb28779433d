"""Issue 27's CPU targets with the variants measured in alternating windows, not one after
another.

The ``stack`` phase measures the full stack, the same build with frames off and the peer
minutes apart, each on its own; on this shared 2-core machine the CPU a process spends per
event drifts by 20-50% between such windows (the upstream simulator, whose code never
changes, went from 7.6 to 12.1 ms per 1,000 events between two runs of 2026-12-05), so a
ratio of two figures from different windows carries that drift. Here the three stand side by
side (a fresh full stack, a fresh full stack with ``TOKENWIRE_FRAMES=false``, and LiteLLM's
proxy in front of its own scripted provider, all started before the first window), and each
round runs the same 50 callers x ``each`` requests x 200 fragments against each in turn,
rotating which goes first; each round's ratios come from adjacent windows. The figures are
the medians over the rounds; the per-round ratios are kept too.

The two tokenwire variants send :data:`OURS_FACTOR` times as many requests per caller as the
peer in each round: CPU per event does not depend on the window's length, and their windows
would otherwise last 2-3 s (the peer's 1-2 minutes), short enough for one busy moment of a
shared machine to move a round's figure by a third (session 20: 42.9 to 79.1 in one run).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import psutil
import uvloop

from bench import _peer
from bench._procs import full_stack, scripted_and_proxy
from bench._suite import Figures, Profile, sizes
from bench.bench_stack import CALLERS, FRAMES_OFF, load

PHASE = "interleaved"
FRAGMENTS = 200
OURS_FACTOR = 3
"""How many times the peer's requests per caller the tokenwire variants send in a round."""
VARIANTS = ("full", "v1", "peer")
"""The full stack, the same build with frames off, the peer (when installed)."""


@dataclass
class Variant:
    """One side of the comparison: where its callers go, which processes count."""

    name: str
    port: int
    procs: dict[str, psutil.Process]
    totals: list[float]


def _progress(what: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


@contextlib.asynccontextmanager
async def _variants(with_peer: bool) -> AsyncIterator[list[Variant]]:
    async with contextlib.AsyncExitStack() as stack:
        full = await stack.enter_async_context(full_stack(shared=True))
        off = await stack.enter_async_context(full_stack(hooks=FRAMES_OFF, shared=True))
        found = [
            Variant("full", full.gateway_port, full.procs, []),
            Variant("v1", off.gateway_port, off.procs, []),
        ]
        exe = await asyncio.to_thread(_peer.ensure_installed) if with_peer else "not asked for"
        if isinstance(exe, str):
            _progress(f"peer skipped: {exe}")
        else:
            sp_port, _, side = await stack.enter_async_context(scripted_and_proxy())
            port, proc = await stack.enter_async_context(
                _peer.litellm_proxy(exe, sp_port, [f"fragments={FRAGMENTS}"])
            )
            procs = {"litellm": proc, "scripted": side["scripted"], "load": side["load"]}
            found.append(Variant("peer", port, procs, []))
        yield found


async def _run(fig: Figures, profile: Profile, with_peer: bool) -> None:
    rounds, each = sizes(profile, 1, 3, 5), sizes(profile, 2, 4, 10)
    callers = sizes(profile, 5, CALLERS, CALLERS)
    async with _variants(with_peer) as variants:
        for v in variants:  # warm-up: connections, imports, the provider's pools
            await load(v.port, callers, 1, FRAGMENTS, v.procs)
        for r in range(rounds):
            order = variants[r % len(variants) :] + variants[: r % len(variants)]
            for v in order:
                _progress(f"round {r + 1}/{rounds}: {v.name}")
                n = each if v.name == "peer" else each * OURS_FACTOR
                _, cpu, events = await load(v.port, callers, n, FRAGMENTS, v.procs)
                v.totals.append(sum(cpu.values()) / events * 1e6)
                for name, seconds in cpu.items():
                    fig.put(PHASE, f"{v.name}_r{r}_cpu_ms_per_1k_{name}", seconds / events * 1e6)
        _put(fig, variants, rounds)


def _put(fig: Figures, variants: list[Variant], rounds: int) -> None:
    by_name = {v.name: v for v in variants}
    fig.put(PHASE, "rounds", rounds)
    for v in variants:
        fig.put(PHASE, f"{v.name}_cpu_ms_per_1k_total", statistics.median(v.totals))
    full = by_name["full"].totals
    for other in ("v1", "peer"):
        if other not in by_name:
            continue
        ratios = [o / f for o, f in zip(by_name[other].totals, full, strict=True) if f > 0]
        if not ratios:  # a window too short for the 10 ms CPU ticks (the smoke profile)
            continue
        fig.put(PHASE, f"{other}_over_full_median", statistics.median(ratios))
        fig.put(PHASE, f"{other}_over_full_min", min(ratios))
        fig.put(PHASE, f"{other}_over_full_max", max(ratios))


def run(fig: Figures, profile: Profile, peer: bool = True) -> str:
    uvloop.run(_run(fig, profile, peer))
    return table(fig)


def table(fig: Figures) -> str:
    """Each round's CPU per 1,000 events of each variant, and the ratios."""
    g = fig.get
    rounds = int(g(PHASE, "rounds"))
    measured = fig.values.get(PHASE, {})
    names = [n for n in VARIANTS if f"{n}_cpu_ms_per_1k_total" in measured]
    rows = [
        "| round | " + " | ".join(f"{n}, ms per 1,000 events" for n in names) + " |",
        "| --- |" + " ---: |" * len(names),
    ]
    for r in range(rounds):
        cells = []
        for n in names:
            total = sum(v for k, v in measured.items() if k.startswith(f"{n}_r{r}_cpu_ms_per_1k_"))
            cells.append(f"{total:.1f}")
        rows.append(f"| {r + 1} | " + " | ".join(cells) + " |")
    rows.append(
        "| median | "
        + " | ".join(f"{g(PHASE, f'{n}_cpu_ms_per_1k_total'):.1f}" for n in names)
        + " |"
    )
    for other in ("v1", "peer"):
        if f"{other}_over_full_median" in measured:
            low, high = (g(PHASE, f"{other}_over_full_{k}") for k in ("min", "max"))
            median = g(PHASE, f"{other}_over_full_median")
            ratio = f"{median:.2f}x ({low:.2f}-{high:.2f})"
            rows.append(
                f"| {other} / full, per round: median (min-max) | {ratio} |"
                + " |" * (len(names) - 1)
            )
    return "\n".join(rows)
