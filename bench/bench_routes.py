"""What routing costs a step's first byte (issue 45): a public name through a routes file
against ``provider/model`` without one, in the same run (``make bench BENCH=routes``).

One embedded broker, the scripted provider, and two gateway processes run as
``tokenwire gateway`` runs them (uvloop, httptools): the *plain* one has no routes file and is
asked for ``scripted/text``; the *routed* one has a routes file whose public name ``fast`` is a
group of two scripted deployments (weights 3 and 1, same upstream), so every request goes
through the plan (weighted order, health and capacity checks), the attempt wrapper and the
``routed`` field on the first chunk. A lone caller sends one request to each, then the next
pair, the order alternating (so neither side always follows the other), each on its own
keep-alive connection: time to first body bytes, per pair. Target: the routed side adds at
most 0.1 ms at p50 (the median of the pairs' differences).
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from pathlib import Path

import msgspec
import psutil
import uvloop

from bench import bench_gateway as gw
from bench._procs import cpu_s
from bench._suite import pct
from tokenwire.broker import EmbeddedServer, free_port

PAIRS = 2000
OPTIONS = "fragments=2"
TARGET_MS = 0.1
FIGURES: dict[str, float] = {}

_ROUTES = """
[[models]]
name = "fast"
  [[models.deployments]]
  name = "scripted-a"
  provider = "scripted"
  model = "text?{options}"
  base_url = "{upstream}"
  weight = 3
  [[models.deployments]]
  name = "scripted-b"
  provider = "scripted"
  model = "text?{options}"
  base_url = "{upstream}"
  weight = 1
"""
_GATEWAY = """
import sys
from tokenwire.services.gateway import GatewaySettings, main
from tokenwire.services.gateway._routing.routes_file import load_routes
env = {"TOKENWIRE_SCRIPTED_BASE_URL": sys.argv[3]}
routes = load_routes(sys.argv[4], env) if len(sys.argv) > 4 else None
main(GatewaySettings(port=int(sys.argv[1]), nats_url=sys.argv[2], provider_env=env,
                     routes=routes, routes_env=env))
"""


def _request(port: int, model: str, session: str) -> bytes:
    body = msgspec.json.encode(
        {"model": model, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    )
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        f"content-type: application/json\r\nx-tokenwire-session: {session}\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _pairs(plain_port: int, routed_port: int, n: int) -> list[tuple[float, float]]:
    """``n`` (plain, routed) times to first body bytes, after a warm-up pair."""
    plain, routed = await gw.Caller.open(plain_port), await gw.Caller.open(routed_port)
    plain_req = _request(plain_port, f"scripted/text?{OPTIONS}", "routes-plain")
    routed_req = _request(routed_port, "fast", "routes-routed")
    pause = random.Random(45)
    pairs = []
    try:
        for i in range(n + 5):
            if i % 2:
                r, _ = await routed.stream(routed_req)
                p, _ = await plain.stream(plain_req)
            else:
                p, _ = await plain.stream(plain_req)
                r, _ = await routed.stream(routed_req)
            if i >= 5:
                pairs.append((p, r))
            await asyncio.sleep(pause.uniform(0, 0.01))
    finally:
        plain.close()
        routed.close()
    return pairs


async def _run() -> tuple[list[tuple[float, float]], tuple[float, float]]:
    with tempfile.TemporaryDirectory(prefix="tw-bench-routes-") as tmp:
        server = EmbeddedServer(Path(tmp))
        server.start()
        sp, plain_port, routed_port = free_port(), free_port(), free_port()
        upstream = f"http://127.0.0.1:{sp}"
        routes = Path(tmp) / "routes.toml"
        routes.write_text(_ROUTES.format(options=OPTIONS, upstream=upstream))
        procs = [
            gw._spawn(gw._SCRIPTED, str(sp), "8"),
            gw._spawn(_GATEWAY, str(plain_port), server.url, upstream),
            gw._spawn(_GATEWAY, str(routed_port), server.url, upstream, str(routes)),
        ]
        try:
            for port in (sp, plain_port, routed_port):
                await gw._wait_up(port)
            plain, routed = psutil.Process(procs[1].pid), psutil.Process(procs[2].pid)
            before = cpu_s(plain), cpu_s(routed)
            pairs = await _pairs(plain_port, routed_port, PAIRS)
            used = cpu_s(plain) - before[0], cpu_s(routed) - before[1]
            return pairs, (used[0] / (PAIRS + 5), used[1] / (PAIRS + 5))
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)
            server.stop()


def main() -> str:
    """Run the pairs; the table (and ``FIGURES``)."""
    started = time.perf_counter()
    pairs, cpu = uvloop.run(_run())
    plain = [p * 1000 for p, _ in pairs]
    routed = [r * 1000 for _, r in pairs]
    added = [(r - p) * 1000 for p, r in pairs]
    FIGURES.update(
        pairs=len(pairs),
        plain_ttfb_p50_ms=pct(plain, 0.5),
        routed_ttfb_p50_ms=pct(routed, 0.5),
        added_p50_ms=pct(added, 0.5),
        plain_ttfb_p90_ms=pct(plain, 0.9),
        routed_ttfb_p90_ms=pct(routed, 0.9),
        plain_cpu_us_per_request=cpu[0] * 1e6,
        routed_cpu_us_per_request=cpu[1] * 1e6,
        seconds=time.perf_counter() - started,
    )
    f = FIGURES
    verdict = "met" if f["added_p50_ms"] <= TARGET_MS else "missed"
    return "\n".join(
        [
            "| measure | provider/model, no routes file | public name, routes file | added |",
            "| --- | --- | --- | --- |",
            f"| lone caller, time to first byte p50, ms ({len(pairs)} pairs) | "
            f"{f['plain_ttfb_p50_ms']:.3f} | {f['routed_ttfb_p50_ms']:.3f} | "
            f"{f['added_p50_ms']:+.3f} (target <= +{TARGET_MS}: {verdict}) |",
            f"| same, p90, ms | {f['plain_ttfb_p90_ms']:.3f} | {f['routed_ttfb_p90_ms']:.3f} | |",
            f"| gateway process CPU per request, us | {f['plain_cpu_us_per_request']:.0f} | "
            f"{f['routed_cpu_us_per_request']:.0f} | "
            f"{f['routed_cpu_us_per_request'] - f['plain_cpu_us_per_request']:+.0f} |",
        ]
    )
