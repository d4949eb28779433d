"""One gateway change against the gateway without it, in the same run: two gateway processes
in front of one scripted provider and one embedded broker, a lone caller alternating a request
to each (``bench_routes``, ``bench_admission``): time to first body bytes per pair, and each
process's CPU per request."""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import uvloop

from bench import bench_gateway as gw
from bench._procs import cpu_s
from bench._suite import pct
from tokenwire.broker import EmbeddedServer, free_port

WARM = 5
"""Pairs sent first and not counted."""


@dataclass(frozen=True)
class Side:
    """One gateway of the pair: its extra argv (after port, broker URL and upstream), and the
    request it is asked, built from its port."""

    argv: Sequence[str]
    request: Callable[[int], bytes]


async def alternating_pairs(
    a: tuple[int, bytes], b: tuple[int, bytes], n: int, seed: int
) -> list[tuple[float, float]]:
    """``n`` (a, b) times to first body bytes, after :data:`WARM` pairs: each side on its own
    keep-alive connection, the order alternating, a random pause of up to 10 ms between pairs."""
    first, second = await gw.Caller.open(a[0]), await gw.Caller.open(b[0])
    pause = random.Random(seed)
    pairs = []
    try:
        for i in range(n + WARM):
            if i % 2:
                tb, _ = await second.stream(b[1])
                ta, _ = await first.stream(a[1])
            else:
                ta, _ = await first.stream(a[1])
                tb, _ = await second.stream(b[1])
            if i >= WARM:
                pairs.append((ta, tb))
            await asyncio.sleep(pause.uniform(0, 0.01))
    finally:
        first.close()
        second.close()
    return pairs


async def _run(
    code: str, sides: Callable[[Path, str], tuple[Side, Side]], n: int, seed: int
) -> tuple[list[tuple[float, float]], tuple[float, float]]:
    with tempfile.TemporaryDirectory(prefix="tw-bench-ab-") as tmp:
        server = EmbeddedServer(Path(tmp))
        server.start()
        sp, a_port, b_port = free_port(), free_port(), free_port()
        upstream = f"http://127.0.0.1:{sp}"
        a, b = sides(Path(tmp), upstream)
        procs = [
            gw._spawn(gw._SCRIPTED, str(sp), "8"),
            gw._spawn(code, str(a_port), server.url, upstream, *a.argv),
            gw._spawn(code, str(b_port), server.url, upstream, *b.argv),
        ]
        try:
            for port in (sp, a_port, b_port):
                await gw._wait_up(port)
            pa, pb = psutil.Process(procs[1].pid), psutil.Process(procs[2].pid)
            before = cpu_s(pa), cpu_s(pb)
            pairs = await alternating_pairs(
                (a_port, a.request(a_port)), (b_port, b.request(b_port)), n, seed
            )
            used = cpu_s(pa) - before[0], cpu_s(pb) - before[1]
            return pairs, (used[0] / (n + WARM), used[1] / (n + WARM))
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)
            server.stop()


def measure(
    code: str,
    sides: Callable[[Path, str], tuple[Side, Side]],
    *,
    n: int,
    seed: int,
    name: str,
) -> dict[str, float]:
    """Run the pairs: the figures, ``plain_*`` for the first side and ``<name>_*`` for the
    second (time to first byte p50 and p90, the p50 of the pairs' differences, CPU per
    request)."""
    started = time.perf_counter()
    pairs, cpu = uvloop.run(_run(code, sides, n, seed))
    plain = [p * 1000 for p, _ in pairs]
    other = [r * 1000 for _, r in pairs]
    return {
        "pairs": len(pairs),
        "plain_ttfb_p50_ms": pct(plain, 0.5),
        f"{name}_ttfb_p50_ms": pct(other, 0.5),
        "added_p50_ms": pct([(r - p) * 1000 for p, r in pairs], 0.5),
        "plain_ttfb_p90_ms": pct(plain, 0.9),
        f"{name}_ttfb_p90_ms": pct(other, 0.9),
        "plain_cpu_us_per_request": cpu[0] * 1e6,
        f"{name}_cpu_us_per_request": cpu[1] * 1e6,
        "seconds": time.perf_counter() - started,
    }


def table(f: dict[str, float], *, name: str, heads: tuple[str, str], target_ms: float) -> str:
    """The pair's table: time to first byte at p50 and p90, the added p50 against the
    target, and CPU per request."""
    verdict = "met" if f["added_p50_ms"] <= target_ms else "missed"
    cpu = f[f"{name}_cpu_us_per_request"]
    return "\n".join(
        [
            f"| measure | {heads[0]} | {heads[1]} | added |",
            "| --- | --- | --- | --- |",
            f"| lone caller, time to first byte p50, ms ({f['pairs']:.0f} pairs) | "
            f"{f['plain_ttfb_p50_ms']:.3f} | {f[f'{name}_ttfb_p50_ms']:.3f} | "
            f"{f['added_p50_ms']:+.3f} (target <= +{target_ms}: {verdict}) |",
            f"| same, p90, ms | {f['plain_ttfb_p90_ms']:.3f} | {f[f'{name}_ttfb_p90_ms']:.3f} | |",
            f"| gateway process CPU per request, us | {f['plain_cpu_us_per_request']:.0f} | "
            f"{cpu:.0f} | {cpu - f['plain_cpu_us_per_request']:+.0f} |",
        ]
    )
