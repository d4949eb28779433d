"""What a key's limits and budget cost a step's first byte (issue 46): the same routed model
with a key that has limits and a budget against a key that has none, in the same run
(``make bench BENCH=admission``).

One embedded broker, the scripted provider, and two gateway processes run as ``tokenwire
gateway`` runs them (uvloop, httptools), both with the same routes file (a public name whose
one scripted deployment has a price, so that a budget can price it) and the same keys file:
the *plain* one is asked with a key without limits; the *limited* one with a key that has
requests and tokens per minute, concurrent streams and a daily budget, under a tenant that has
them too (eight admissions per call; the limits are high, so nothing is refused and the
leases stay in memory: the common case). A lone caller alternates pairs as ``bench_routes``
does. Target: limits add at most 0.2 ms at p50 (the median of the pairs' differences).
"""

from __future__ import annotations

import asyncio
import hashlib
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
TARGET_MS = 0.2
FIGURES: dict[str, float] = {}
PLAIN_KEY, LIMITED_KEY = "bench-plain-key", "bench-limited-key"

_ROUTES = """
[[models]]
name = "fast"
  [[models.deployments]]
  name = "scripted-priced"
  provider = "scripted"
  model = "text?{options}"
  base_url = "{upstream}"
  price = {{ input = 2.5, output = 10 }}
"""
_LIMITS = '{ rpm = 1000000, tpm = 1000000000, concurrent = 1000, budget = { usd = "1000000" } }'
_KEYS = """
[[keys]]
name = "plain"
sha256 = "{plain}"
[[keys]]
name = "limited"
sha256 = "{limited}"
tenant = "acme"
limits = {limits}
[[tenants]]
name = "acme"
limits = {limits}
"""
_GATEWAY = """
import sys
from tokenwire.services.gateway import GatewaySettings, main
from tokenwire.services.gateway._access.keys import load_keys_file
from tokenwire.services.gateway._routing.routes_file import load_routes
env = {"TOKENWIRE_SCRIPTED_BASE_URL": sys.argv[3]}
main(GatewaySettings(port=int(sys.argv[1]), nats_url=sys.argv[2], provider_env=env,
                     routes=load_routes(sys.argv[4], env), routes_env=env,
                     named_keys=load_keys_file(sys.argv[5])))
"""


def _request(port: int, key: str, session: str) -> bytes:
    body = msgspec.json.encode(
        {"model": "fast", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    )
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
        f"authorization: Bearer {key}\r\n"
        f"content-type: application/json\r\nx-tokenwire-session: {session}\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _pairs(plain_port: int, limited_port: int, n: int) -> list[tuple[float, float]]:
    """``n`` (plain, limited) times to first body bytes, after a warm-up pair."""
    plain, limited = await gw.Caller.open(plain_port), await gw.Caller.open(limited_port)
    plain_req = _request(plain_port, PLAIN_KEY, "admission-plain")
    limited_req = _request(limited_port, LIMITED_KEY, "admission-limited")
    pause = random.Random(46)
    pairs = []
    try:
        for i in range(n + 5):
            if i % 2:
                lim, _ = await limited.stream(limited_req)
                p, _ = await plain.stream(plain_req)
            else:
                p, _ = await plain.stream(plain_req)
                lim, _ = await limited.stream(limited_req)
            if i >= 5:
                pairs.append((p, lim))
            await asyncio.sleep(pause.uniform(0, 0.01))
    finally:
        plain.close()
        limited.close()
    return pairs


def _files(tmp: Path, upstream: str) -> tuple[Path, Path]:
    routes, keys = tmp / "routes.toml", tmp / "keys.toml"
    routes.write_text(_ROUTES.format(options=OPTIONS, upstream=upstream))
    digests = {k: hashlib.sha256(v.encode()).hexdigest() for k, v in
               (("plain", PLAIN_KEY), ("limited", LIMITED_KEY))}  # fmt: skip
    keys.write_text(_KEYS.format(limits=_LIMITS, **digests))
    return routes, keys


async def _run() -> tuple[list[tuple[float, float]], tuple[float, float]]:
    with tempfile.TemporaryDirectory(prefix="tw-bench-admission-") as tmp:
        server = EmbeddedServer(Path(tmp))
        server.start()
        sp, plain_port, limited_port = free_port(), free_port(), free_port()
        upstream = f"http://127.0.0.1:{sp}"
        routes, keys = _files(Path(tmp), upstream)
        files = (str(routes), str(keys))
        procs = [
            gw._spawn(gw._SCRIPTED, str(sp), "8"),
            gw._spawn(_GATEWAY, str(plain_port), server.url, upstream, *files),
            gw._spawn(_GATEWAY, str(limited_port), server.url, upstream, *files),
        ]
        try:
            for port in (sp, plain_port, limited_port):
                await gw._wait_up(port)
            plain, limited = psutil.Process(procs[1].pid), psutil.Process(procs[2].pid)
            before = cpu_s(plain), cpu_s(limited)
            pairs = await _pairs(plain_port, limited_port, PAIRS)
            used = cpu_s(plain) - before[0], cpu_s(limited) - before[1]
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
    limited = [r * 1000 for _, r in pairs]
    added = [(r - p) * 1000 for p, r in pairs]
    FIGURES.update(
        pairs=len(pairs),
        plain_ttfb_p50_ms=pct(plain, 0.5),
        limited_ttfb_p50_ms=pct(limited, 0.5),
        added_p50_ms=pct(added, 0.5),
        plain_ttfb_p90_ms=pct(plain, 0.9),
        limited_ttfb_p90_ms=pct(limited, 0.9),
        plain_cpu_us_per_request=cpu[0] * 1e6,
        limited_cpu_us_per_request=cpu[1] * 1e6,
        seconds=time.perf_counter() - started,
    )
    f = FIGURES
    verdict = "met" if f["added_p50_ms"] <= TARGET_MS else "missed"
    return "\n".join(
        [
            "| measure | key without limits | key and tenant with limits and budget | added |",
            "| --- | --- | --- | --- |",
            f"| lone caller, time to first byte p50, ms ({len(pairs)} pairs) | "
            f"{f['plain_ttfb_p50_ms']:.3f} | {f['limited_ttfb_p50_ms']:.3f} | "
            f"{f['added_p50_ms']:+.3f} (target <= +{TARGET_MS}: {verdict}) |",
            f"| same, p90, ms | {f['plain_ttfb_p90_ms']:.3f} | {f['limited_ttfb_p90_ms']:.3f} | |",
            f"| gateway process CPU per request, us | {f['plain_cpu_us_per_request']:.0f} | "
            f"{f['limited_cpu_us_per_request']:.0f} | "
            f"{f['limited_cpu_us_per_request'] - f['plain_cpu_us_per_request']:+.0f} |",
        ]
    )
