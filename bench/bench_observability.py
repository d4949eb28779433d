"""What observability costs the gateway: the same gateway with OTLP export off and on, one run.

Two gateway processes on one embedded nats-server in front of one scripted provider: ``off``
(no ``OTEL_EXPORTER_OTLP_ENDPOINT``: the API's no-op providers, the fast trace-context path)
and ``on`` (the endpoint set to a local OTLP/HTTP receiver in its own process: the SDK's
tracer and meter providers, a CLIENT span and the GenAI metrics per model call, batch span
export, metric export every 5 s). Both always keep their Prometheus figures.

(c1) the gateway process's CPU per published chunk, 200 concurrent sessions x 100 fragments at
     full speed (bench_gateway (b)'s load): ``TURNS`` turns of off then on (each the best of 3
     rounds); reported: the lower CPU per chunk of each side, and the median and range of the
     per-turn ratios on/off (a shared VM's CPU per chunk drifts by tens of percent between
     rounds; adjacent rounds drift least, so the paired ratio is the steadier figure);
(c2) added time to first chunk: 50 sessions, each sending requests one after another,
     alternating ``off`` and ``on`` (bench_gateway (d)'s pairs; half of them ``on`` first), the
     provider pacing fragments at 50/s; p50/p99 of the per-pair difference (on - off).
"""

from __future__ import annotations

import functools
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import uvloop

from bench.bench_gateway import (
    _GATEWAY,
    _SCRIPTED,
    FRAGMENTS_B,
    PAIRS_D,
    SESSIONS_B,
    SESSIONS_D,
    Load,
    _pct,
    _stream_count,
    _wait_up,
    bench_load,
    bench_ttfc,
)
from tokenwire.broker import EmbeddedServer, free_port

TURNS = 6
"""(c1) off/on turns; each turn's ratio on/off is one sample."""

_RECEIVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", "0")))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
    def do_GET(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _spawn(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    src = str(Path(__file__).resolve().parents[1] / "src")
    full = {**os.environ, "PYTHONPATH": src, **(env or {})}
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SDK_DISABLED"):
        if env is None or name not in env:
            full.pop(name, None)
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], env=full,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


async def _run() -> tuple[Load, Load, list[tuple[float, float]]]:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer(Path(tmp))
        server.start()
        sp_port, off_port, on_port, rx_port = (free_port() for _ in range(4))
        upstream = f"http://127.0.0.1:{sp_port}"
        otel = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rx_port}",
            "OTEL_METRIC_EXPORT_INTERVAL": "5000",
            "OTEL_SERVICE_NAME": "bench-gateway-on",
        }
        procs = [
            _spawn(_SCRIPTED, str(sp_port), str(FRAGMENTS_B)),
            _spawn(_RECEIVER, str(rx_port)),
            off := _spawn(_GATEWAY, str(off_port), server.url, upstream),
            on := _spawn(_GATEWAY, str(on_port), server.url, upstream, env=otel),
        ]
        try:
            for port in (sp_port, off_port, on_port, rx_port):
                await _wait_up(port)
            me = psutil.Process()
            common = {
                "scripted": psutil.Process(procs[0].pid), "load": me,
                "nats": next(p for p in me.children() if p.name() == "nats-server"),
            }  # fmt: skip
            # Both orders within a pair (the second request of a pair runs warmer): half the
            # pairs send off first, half on first.
            pairs = await bench_ttfc(off_port, on_port, SESSIONS_D, PAIRS_D // 2)
            swapped = await bench_ttfc(on_port, off_port, SESSIONS_D, PAIRS_D // 2)
            pairs += [(off_s, on_s) for on_s, off_s in swapped]
            count = functools.partial(_stream_count, server.url)
            loads: dict[str, list[Load]] = {"off": [], "on": []}
            for turn in range(TURNS):  # off, on, off, on: drift in the machine's load hits both
                for tag, port, proc in (("off", off_port, off), ("on", on_port, on)):
                    gw = {**common, "gateway": psutil.Process(proc.pid)}
                    loads[tag].append(await bench_load([port], f"{tag}{turn}", gw, count))
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)
            server.stop()
    return loads["off"], loads["on"], pairs


def _table(offs: list[Load], ons: list[Load], pairs: list[tuple[float, float]]) -> str:
    off, on = (min(v, key=lambda x: x.us_per_unit("gateway")) for v in (offs, ons))
    us_off, us_on = off.us_per_unit("gateway"), on.us_per_unit("gateway")
    turns = [
        b.us_per_unit("gateway") / a.us_per_unit("gateway") for a, b in zip(offs, ons, strict=True)
    ]
    label = f"(c1) {SESSIONS_B} sessions x {FRAGMENTS_B} fragments"
    ms = 1000.0
    base = [d * ms for d, _ in pairs]
    with_otel = [g * ms for _, g in pairs]
    added = [(g - d) * ms for d, g in pairs]
    rows = [
        "| measure | export off | export on | ratio / added |",
        "| --- | --- | --- | --- |",
        f"| {label}: gateway CPU per chunk, us | {us_off:.1f} | {us_on:.1f} "
        f"| {us_on / us_off:.2f}x |",
        f"| {label}: gateway CPU per chunk, paired turns on/off | {len(turns)} turns | "
        f"| median {statistics.median(turns):.2f}x ({min(turns):.2f}-{max(turns):.2f}) |",
        f"| {label}: chunks/s end to end | {off.rate:,.0f} | {on.rate:,.0f} "
        f"| {on.rate / off.rate:.2f}x |",
    ]
    for q in (50, 99):
        rows.append(
            f"| (c2) {SESSIONS_D} sessions, alternating: time to first chunk p{q}, ms "
            f"| {_pct(base, q / 100):.2f} | {_pct(with_otel, q / 100):.2f} "
            f"| {_pct(added, q / 100):+.2f} ms (per pair) |"
        )
    rows.append(f"| (c2) pairs | {len(pairs)} | | mean {statistics.mean(added):+.2f} ms |")
    return "\n".join(rows)


def main() -> str:
    """Run (c1) and (c2) on one fresh embedded broker; a table."""
    return _table(*uvloop.run(_run()))


if __name__ == "__main__":
    print(main())
