"""``make bench``: the one-run suite (limits first, then tokenwire, the peer, the scaling curves),
or ``make bench BENCH=<name>`` for one part; ``python -m bench --list`` names the parts.

Options: ``--profile smoke|default|long`` (or ``BENCH_PROFILE``; ``make bench-long``),
``--no-peer``, ``--out DIR`` (JSON and tables; default bench/results), ``--docs DIR`` (where
benchmarks.md, capacity.md and img/ are written; default docs; ``--no-docs`` writes none),
``--final`` (drop the "preliminary, measured under load" mark from the docs).
Each part's figures go to ``<out>/results.json`` (a part run alone is merged into the last
full run's file); the docs are computed from that file.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import importlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import uvloop

from bench import _procs, _report, capacity
from bench._suite import PROFILES, REPO, Figures, Profile, load, machine, save, sizes


def _scale(profile: Profile) -> None:
    """Sizes of the existing modules for the profile (their module constants)."""
    from bench import bench_assembler, bench_gateway, bench_replay, bench_telemetry

    g = bench_gateway
    g.SESSIONS_B, g.FRAGMENTS_B, g.FRAGMENTS_LONG = sizes(
        profile, (10, 20, 50), (200, 100, 500), (200, 100, 500)
    )
    g.ROUNDS_B = sizes(profile, 1, 2, 3)
    g.SESSIONS_D, g.PAIRS_D = sizes(profile, (3, 2), (50, 10), (50, 20))
    g.SERIAL_D = sizes(profile, 3, 40, 100)
    g.CALLERS_E, g.REQUESTS_E = sizes(profile, (2, 2), (20, 20), (20, 50))
    g.N_A = sizes(profile, 2_000, 60_000, 60_000)
    a = bench_assembler
    a.STEPS = sizes(profile, 100, 5_000, 5_000)
    a.LATENCY_SECONDS = sizes(profile, 0.5, 2.0, 4.0)
    a.OPEN_STEPS = sizes(profile, 100, 10_000, 10_000)
    r = bench_replay
    r.N, r.STEP_CHUNKS, r.N_SESSION_READER = sizes(
        profile, (2_000, 100, 1_000), (200_000, 1_000, 50_000), (1_000_000, 1_000, 200_000)
    )
    t = bench_telemetry
    t.STEPS, t.CHUNKS_BIG = sizes(profile, (20, 50), (1_000, 200), (1_000, 1_000))
    from bench import bench_floor, bench_paced, bench_shards

    bench_floor.scale(
        *sizes(
            profile, (5, 1, 1, 1, 150, False), (150, 3, 4, 3, 400, True), (150, 3, 8, 3, 400, True)
        )
    )

    from bench import bench_routes

    bench_routes.PAIRS = sizes(profile, 50, 2_000, 5_000)
    from bench import bench_admission

    bench_admission.PAIRS = sizes(profile, 50, 2_000, 5_000)
    bench_shards.CHUNKS = sizes(profile, 5_000, 100_000, 200_000)
    bench_shards.STEPS = sizes(profile, 1_000, 10_000, 20_000)
    bench_paced.scale(
        *sizes(
            profile, ((5,), 3.0, 1.0), ((50, 100, 150), 30.0, 10.0), ((100, 200, 400), 60.0, 10.0)
        )
    )


def _limits(fig: Figures, profile: Profile, _: argparse.Namespace) -> str:
    from bench import bench_limits

    return bench_limits.run(fig, profile)


def _gateway(fig: Figures, profile: Profile, _: argparse.Namespace) -> str:
    from bench import bench_gateway as g

    r = uvloop.run(g._run())
    put = fig.put
    put("gateway", "b_chunks_per_s", r.gateway.rate)
    put("gateway", "b_long_chunks_per_s", r.gateway_long.rate)
    put("gateway", "b_limit_per_s", r.limit)
    put("gateway", "b_cpu_us_per_chunk", r.gateway.us_per_unit("gateway"))
    put("gateway", "b_long_cpu_us_per_chunk", r.gateway_long.us_per_unit("gateway"))
    put("gateway", "b2_chunks_per_s", r.pair.rate)
    for tag, pairs in (("d", r.ttfc), ("d1", r.serial), ("d0", r.floor)):
        added = [(b - a) * 1000 for a, b in pairs]
        put("gateway", f"{tag}_added_p50_ms", sorted(added)[len(added) // 2])
    aio, ours = r.clients
    put("gateway", "e_aiohttp_p50_ms", sorted(aio)[len(aio) // 2] * 1000)
    put("gateway", "e_httpclient_p50_ms", sorted(ours)[len(ours) // 2] * 1000)
    return g._table(r)


def _stack(fig: Figures, profile: Profile, args: argparse.Namespace) -> str:
    from bench import bench_stack

    return bench_stack.run(fig, profile, peer=not args.no_peer and profile != "smoke")


def _interleaved(fig: Figures, profile: Profile, args: argparse.Namespace) -> str:
    from bench import bench_interleaved

    return bench_interleaved.run(fig, profile, peer=not args.no_peer and profile != "smoke")


def _module(name: str) -> Callable[[Figures, Profile, argparse.Namespace], str]:
    def run(fig: Figures, profile: Profile, _: argparse.Namespace) -> str:
        module = importlib.import_module(f"bench.bench_{name}")
        table: str = module.main()
        for key, value in getattr(module, "FIGURES", {}).items():
            fig.put(name, key, value)
        return table

    return run


def _floor(fig: Figures, profile: Profile, args: argparse.Namespace) -> str:
    """The floor part's table, closed by the capacity model's total with its figures (the
    paced phase's inputs: this run's, else the last full run's)."""
    table = _module("floor")(fig, profile, args)
    merged = copy.deepcopy(fig)
    previous = load(args.out / "results.json")
    if previous is not None:
        merged.merge(previous)
    return table + "\n\n" + capacity.floor_line(merged)


def _paced(fig: Figures, profile: Profile, _: argparse.Namespace) -> str:
    from bench import bench_paced

    table = bench_paced.main(full=profile != "smoke")
    for key, value in bench_paced.FIGURES.items():
        fig.put("paced", key, value)
    fig.notes["paced"] = "; ".join(bench_paced.NOTES)
    return table


def _scaling(fig: Figures, profile: Profile, _: argparse.Namespace) -> str:
    from bench import bench_scaling

    return bench_scaling.run(fig, profile)


PARTS: dict[str, Callable[[Figures, Profile, argparse.Namespace], str]] = {
    "limits": _limits,
    "gateway": _gateway,
    "stack": _stack,
    "interleaved": _interleaved,
    "assembler": _module("assembler"),
    "replay": _module("replay"),
    "telemetry": _module("telemetry"),
    "scaling": _scaling,
    "paced": _paced,
    "shards": _module("shards"),
    "floor": _floor,
    "routes": _module("routes"),
    "admission": _module("admission"),
}
SHARED_STACKS = {"stack", "interleaved"}
"""Parts that start the same full stacks (the whole stack, and the same with frames off): with
the smoke profile, when one runs right after the other, the stacks the first started serve
the second (``bench._procs.kept_stacks``) instead of two more starts."""
EXTRA = (
    "publish",
    "fold",
    "parse",
    "frames",
    "compression",
    "request_body",
    "firstbyte",
    "step_path",
)
"""Only when named, their own tables; ``frames`` (messages, bytes and CPU per chunk against
lingers, ADR 0024), ``compression`` (bytes per chunk on disk with and without S2, ADR 0023)
and ``firstbyte`` (issue 47's method: the added first byte against LiteLLM's, ADR 0043) record
their figures; ``step_path`` measures the gateway's per-read work in process (ADR 0044).
``paced`` (the stack at 50 tokens/s per session, shipped defaults) and ``shards`` (one
stream's ceiling on a loopback R3 cluster) and ``floor`` (the gateway's CPU per token at that
pace against two relaying floors) run by default: docs/capacity.md is computed from them;
``routes`` (what a routes file adds to the first byte, issue 45) and ``admission`` (what a
key's limits and budget add to it, issue 46) too."""


def _args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench")
    p.add_argument("parts", nargs="*", help=f"parts to run: {', '.join((*PARTS, *EXTRA))}")
    p.add_argument(
        "--profile", choices=PROFILES, default=os.environ.get("BENCH_PROFILE", "default")
    )
    p.add_argument("--no-peer", action="store_true", help="skip the LiteLLM peer")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--docs", type=Path, default=REPO / "docs")
    p.add_argument("--no-docs", action="store_true")
    p.add_argument("--final", action="store_true", help="figures from a quiet machine")
    p.add_argument("--list", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    args = _args(argv)
    if args.list:
        print("\n".join((*PARTS, *EXTRA)))
        return 0
    profile: Profile = args.profile
    _scale(profile)
    wanted = [n for n in (*PARTS, *EXTRA) if not args.parts or any(a in n for a in args.parts)]
    if not args.parts:
        wanted = list(PARTS)
    fig = Figures(profile, machine=machine())
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.json"
    previous = load(results) if args.parts else None  # a named part's run keeps the others
    if previous is not None and previous.profile != profile:
        previous = None
    with contextlib.ExitStack() as kept:
        for i, name in enumerate(wanted):
            after = wanted[i + 1] if i + 1 < len(wanted) else ""
            keep = profile == "smoke" and {name, after} <= SHARED_STACKS
            if keep and not _procs.keeping():
                kept.enter_context(_procs.kept_stacks())
            print(f"\n## {name} ({profile})\n", flush=True)
            started = time.perf_counter()
            part = PARTS.get(name) or _module(name)
            table = part(fig, profile, args)
            fig.seconds[name] = time.perf_counter() - started
            if not keep:
                kept.close()  # the shared stacks stop once no next part asks for them
            fig.tables[name] = table
            print(table, flush=True)
            print(f"\n({fig.seconds[name]:.1f} s)", flush=True)
            (args.out / f"bench_{name}.md").write_text(table + "\n")
            _save_so_far(fig, previous, results)
    if previous is not None:
        fig.merge(previous)
    if not args.no_docs:
        _docs(fig, args.docs, preliminary=not args.final)
    print(f"\nfigures: {results}; total {sum(fig.seconds.values()):.0f} s", flush=True)
    return 0


def _save_so_far(fig: Figures, previous: Figures | None, results: Path) -> None:
    """Write the figures measured so far after every part (with the previous run's other
    phases when parts were named), so that a later part's failure loses none of them."""
    so_far = copy.deepcopy(fig)
    if previous is not None:
        so_far.merge(previous)
    save(so_far, results)


def _docs(fig: Figures, docs: Path, preliminary: bool) -> None:
    save(fig, docs / "bench-results.json")  # what docs/capacity.md is computed from
    images = _report.plots(fig, docs / "img")
    _report.write_doc(docs / "benchmarks.md", _report.generated(fig, images, preliminary))
    (docs / "capacity.md").write_text(capacity.render(fig, preliminary))


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    raise SystemExit(main(sys.argv[1:]))
