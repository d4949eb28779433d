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
     provider pacing fragments at 50/s; p50 and p99 of each side against those of the ``off``
     requests interleaved with it, and the median per-pair difference. Not the p99 of the
     per-pair differences: for two heavy-tailed samples that is large with no effect at all
     (an A/A pair showed +60 to +125 ms).

Both measures run a third gateway, ``ctl``, identical to ``off``: an A/A control. Whatever it
reports against ``off`` is the harness's own difference (process order, ports, the machine's
drift), not observability's; a difference for ``on`` means something only beyond it.
"""

from __future__ import annotations

import functools
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
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
        [sys.executable, "-c", code, *args],
        env=full,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


Pairs = list[tuple[float, float]]
"""(c2) time-to-first-chunk pairs, seconds: (the reference gateway's, the other's)."""


@dataclass
class Side:
    """One gateway's figures against the reference ``off`` gateway."""

    loads: list[Load] = field(default_factory=list)
    pairs: Pairs = field(default_factory=list)


async def _pairs(ref_port: int, port: int) -> Pairs:
    """(c2) pairs against the reference, half of them sent to the reference first (the second
    request of a pair runs warmer)."""
    pairs = await bench_ttfc(ref_port, port, SESSIONS_D, PAIRS_D // 2)
    swapped = await bench_ttfc(port, ref_port, SESSIONS_D, PAIRS_D // 2)
    return pairs + [(ref_s, s) for s, ref_s in swapped]


async def _run() -> dict[str, Side]:
    """``off`` (the reference), ``ctl`` (a second, identical ``off`` gateway: the A/A control,
    which shows what the harness alone reports as a difference) and ``on``."""
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer(Path(tmp))
        server.start()
        sp_port, rx_port = free_port(), free_port()
        ports = {tag: free_port() for tag in ("off", "ctl", "on")}
        upstream = f"http://127.0.0.1:{sp_port}"
        otel = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{rx_port}",
            "OTEL_METRIC_EXPORT_INTERVAL": "5000",
            "OTEL_SERVICE_NAME": "bench-gateway-on",
        }
        procs = [_spawn(_SCRIPTED, str(sp_port), str(FRAGMENTS_B)), _spawn(_RECEIVER, str(rx_port))]
        gateways = {
            tag: _spawn(
                _GATEWAY, str(port), server.url, upstream, env=otel if tag == "on" else None
            )
            for tag, port in ports.items()
        }
        procs += gateways.values()
        sides = {tag: Side() for tag in ports}
        try:
            for port in (sp_port, rx_port, *ports.values()):
                await _wait_up(port)
            me = psutil.Process()
            common = {
                "scripted": psutil.Process(procs[0].pid),
                "load": me,
                "nats": next(p for p in me.children() if p.name() == "nats-server"),
            }
            for tag in ("ctl", "on"):
                sides[tag].pairs = await _pairs(ports["off"], ports[tag])
            count = functools.partial(_stream_count, server.url)
            for turn in range(TURNS):  # off, ctl, on, ...: drift in the machine's load hits all
                for tag, port in ports.items():
                    gw = {**common, "gateway": psutil.Process(gateways[tag].pid)}
                    sides[tag].loads.append(await bench_load([port], f"{tag}{turn}", gw, count))
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)
            server.stop()
    return sides


def _us(load: Load) -> float:
    return load.us_per_unit("gateway")


def _table(sides: dict[str, Side]) -> str:
    ms = 1000.0
    label = f"(c1) {SESSIONS_B} sessions x {FRAGMENTS_B} fragments, gateway CPU per chunk"
    off = sides["off"]
    rows = [
        "| measure | off (reference) | ctl: a second off (A/A control) | on (OTLP export) |",
        "| --- | --- | --- | --- |",
        f"| {label}, best of {TURNS} turns, us | {min(map(_us, off.loads)):.1f} "
        + "".join(f"| {min(map(_us, sides[t].loads)):.1f} " for t in ("ctl", "on"))
        + "|",
    ]
    paired = {
        t: [_us(b) / _us(a) for a, b in zip(off.loads, sides[t].loads, strict=True)]
        for t in ("ctl", "on")
    }
    rows.append(
        f"| {label}, per-turn ratio to off, median (range) | 1.00x "
        + "".join(
            f"| {statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f}) " for r in paired.values()
        )
        + "|"
    )
    for q in (50, 99):
        refs, cells = [], []
        for t in ("ctl", "on"):
            ref = _pct([a * ms for a, _ in sides[t].pairs], q / 100)
            other = _pct([b * ms for _, b in sides[t].pairs], q / 100)
            refs.append(f"{ref:.2f}")
            cells.append(f"| {other:.2f} ({other - ref:+.2f} against its off) ")
        rows.append(
            f"| (c2) {SESSIONS_D} sessions, time to first chunk p{q}, ms "
            f"| {' / '.join(refs)} (in the ctl / on pairs) {''.join(cells)}|"
        )
    for t in ("ctl", "on"):
        added = [(b - a) * ms for a, b in sides[t].pairs]
        rows.append(
            f"| (c2) {t}: median per-pair difference, ms | | "
            + ("" if t == "ctl" else "| ")
            + f"{statistics.median(added):+.2f} |"
            + (" |" if t == "ctl" else "")
        )
    return "\n".join(rows)


def main() -> str:
    """Run (c1) and (c2) on one fresh embedded broker; a table."""
    return _table(uvloop.run(_run()))


if __name__ == "__main__":
    print(main())
