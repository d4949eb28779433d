"""The gateway's CPU per chunk, this tree against other checkouts, in the same run (issue 19).

``python -m bench.bench_gateway_cpu --baseline DIR`` (repeatable) starts, for this tree and
each checkout at ``DIR`` (each with its own ``.venv``), one embedded nats-server and one gateway
process (as bench_gateway (b) starts it), all in front of one scripted provider; then runs
bench_gateway's (b) load (200 concurrent sessions x 100 and x 500 fragments, full speed)
against each gateway in turn, rotating which goes first, ``--rounds`` times. A round's figure
is the gateway process's own CPU seconds (psutil user + system) over the broker messages it
published (the stream's message count: one per chunk with frames off, one per frame with
frames on, the default), so it is a CPU-time figure, robust to a busy machine in a way
wall-clock rates are not. The raw pipelined publish loop (bench_gateway (a), the limit) runs
before each round's sides in this process, so each side's ratio to it comes from the same run.

``--py-spy PATH`` also records a py-spy profile (``--format raw``, collapsed stacks, native
frames off) of each gateway during one extra round per size, after the CPU rounds (sampling
costs the profiled process CPU, so those rounds are not measured); ``--out DIR`` holds them.
``--cprofile`` runs each gateway under cProfile instead (its stats written to ``--out`` at
exit): the CPU figures are then the profiler's, but its call counts per chunk are exact, which
a busy machine does not blur.
``--paced N``: the rounds run N paced sessions instead (each streams three steps of 100
tokens at 50 tokens/s one after another, the starts spread over a second: the capacity model's
load, docs/capacity.md), and the figure is the gateway's CPU per token streamed. At that pace
nearly every provider read brings one token, so it weighs the per-read work the full-speed
rounds (dozens of events per read) hardly see.
Without ``--baseline`` only this tree runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import uvloop

from bench import bench_gateway as gw
from bench._procs import cpu_s
from bench.bench_publish import raw_pipeline
from tokenwire.broker import EmbeddedServer, connect, ensure_topology, free_port

REPO = Path(__file__).resolve().parents[1]
_CPROFILED = """
import cProfile, signal
_profile = cProfile.Profile()
signal.signal(signal.SIGUSR1, lambda *_: (_profile.disable(), _profile.dump_stats({out!r})))
_profile.enable()
{code}
"""


@dataclass
class Side:
    """One gateway under test: its tree, broker and process, and its rounds' figures."""

    name: str
    tree: Path
    server: EmbeddedServer
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    us: dict[Size, list[float]] = field(default_factory=dict)  # size -> CPU us per unit

    def start(self, upstream: str, cprofile: Path | None) -> None:
        self.port = free_port()
        python = self.tree / ".venv" / "bin" / "python"
        env = {**os.environ, "PYTHONPATH": str(self.tree / "src")}
        code = gw._GATEWAY
        if cprofile is not None:
            cprofile.mkdir(parents=True, exist_ok=True)
            code = _CPROFILED.format(out=str(cprofile / f"{self.name}.pstats"), code=gw._GATEWAY)
        self.proc = subprocess.Popen(
            [str(python), "-c", code, str(self.port), self.server.url, upstream],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self, cprofile: Path | None = None) -> None:
        if self.proc is not None:
            if cprofile is not None:  # SIGUSR1: the profiled gateway writes its stats
                stats = cprofile / f"{self.name}.pstats"
                self.proc.send_signal(signal.SIGUSR1)
                deadline = time.monotonic() + 30
                while not stats.exists() and time.monotonic() < deadline:
                    time.sleep(0.1)
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


PACED = "paced"
PACED_TOKENS, PACED_RATE, PACED_STEPS = 100, 50, 3
Size = int | str
"""A round's load: fragments per full-speed request, or :data:`PACED`."""


async def _paced_round(side: Side, tag: str, sessions: int) -> float:
    """``sessions`` paced callers on ``side``; its gateway's CPU us per token streamed."""
    assert side.proc is not None
    proc = psutil.Process(side.proc.pid)
    before = cpu_s(proc)
    await gw.paced_sessions(
        side.port, sessions, tag, steps=PACED_STEPS, tokens=PACED_TOKENS, rate=PACED_RATE
    )
    return (cpu_s(proc) - before) / (sessions * PACED_STEPS * PACED_TOKENS) * 1e6


async def _count(url: str) -> int:
    return await gw._stream_count(url)


async def _round(side: Side, tag: str, fragments: int) -> float:
    """One round of the (b) load on ``side``; its gateway's CPU us per message published. A round
    a gateway refused (a 503 when the overloaded machine delayed a KV ack past its bound) is
    run again, at most twice, and said so."""
    for attempt in range(3):
        try:
            return await _one_round(side, f"{tag}-{attempt}", fragments)
        except RuntimeError as exc:
            print(f"round {tag} on {side.name} failed, run again: {str(exc)[:160]}")
    raise RuntimeError(f"round {tag} on {side.name} failed three times")


async def _one_round(side: Side, tag: str, fragments: int) -> float:
    assert side.proc is not None
    proc = psutil.Process(side.proc.pid)
    before = await _count(side.server.url)
    _, cpu = await gw._round([side.port], tag, {"gateway": proc}, fragments)
    chunks = await _count(side.server.url) - before
    return cpu["gateway"] / chunks * 1e6


async def _limit(url: str) -> float:
    """CPU us per chunk of the raw pipelined publish loop (bench_gateway (a))."""
    nc = await connect(url)
    t = gw._bench_topology("raw")
    await ensure_topology(nc, t)
    _, cpu_us = await raw_pipeline(
        nc, t, gw.ENVELOPE, n=gw.N_A, sessions=gw.SESSIONS_B, headers=gw.TRACE, mark_first=True
    )
    await nc.close()
    return cpu_us


def _record(py_spy: str, pid: int, out: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            py_spy,
            "record",
            "--pid",
            str(pid),
            "--format",
            "raw",
            "--rate",
            "250",
            "--nonblocking",
            "--output",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def _profile(sides: list[Side], py_spy: str, out: Path, args: argparse.Namespace) -> None:
    for size in _sizes(args):
        for side in sides:
            assert side.proc is not None
            target = out / f"{side.name}-{size if size == PACED else f'x{size}'}.txt"
            recorder = _record(py_spy, side.proc.pid, target)
            await asyncio.sleep(1.0)  # py-spy attaches
            for r in range(2):
                tag = f"prof-{side.name}-{size}-{r}"
                await (
                    _paced_round(side, tag, args.paced)
                    if size == PACED
                    else _round(side, tag, int(size))
                )
            recorder.send_signal(2)  # SIGINT: py-spy writes the file and exits
            recorder.wait(30)


async def _run(args: argparse.Namespace) -> tuple[list[Side], list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        trees = [("new", REPO)] + [(Path(b).name, Path(b)) for b in args.baseline]
        sides = []
        for name, tree in trees:
            server = EmbeddedServer(Path(tmp) / name)
            server.start()
            sides.append(Side(name, tree.resolve(), server))
        sp_port = free_port()
        scripted = gw._spawn(gw._SCRIPTED, str(sp_port), str(gw.FRAGMENTS_B))
        limits: list[float] = []
        try:
            for side in sides:
                side.start(f"http://127.0.0.1:{sp_port}", Path(args.out) if args.cprofile else None)
            for port in (sp_port, *(s.port for s in sides)):
                await gw._wait_up(port)
            for side in sides:  # warm-up: imports, connections, JIT-free caches
                await _round(side, f"warm-{side.name}", gw.FRAGMENTS_B)
            for r in range(args.rounds):
                limits.append(await _limit(sides[0].server.url))
                order = sides[r % len(sides) :] + sides[: r % len(sides)]  # rotated
                for size in _sizes(args):
                    for side in order:
                        tag = f"{side.name}-{r}-{size}"
                        us = await (
                            _paced_round(side, tag, args.paced)
                            if size == PACED
                            else _round(side, tag, int(size))
                        )
                        side.us.setdefault(size, []).append(us)
            if args.py_spy:
                await _profile(sides, args.py_spy, Path(args.out), args)
        finally:
            for side in sides:
                side.stop(Path(args.out) if args.cprofile else None)
            scripted.terminate()
            scripted.wait(10)
            for side in sides:
                side.server.stop()
    return sides, limits


def _sizes(args: argparse.Namespace) -> tuple[Size, ...]:
    return (PACED,) if args.paced else (gw.FRAGMENTS_B, gw.FRAGMENTS_LONG)


def _table(sides: list[Side], limits: list[float]) -> str:
    limit = statistics.median(limits)
    rows = [
        "| gateway | fragments | CPU us per broker message (full speed) or per token "
        "(paced), median (min-max) of rounds | ratio to the raw loop |",
        "| --- | --- | --- | --- |",
    ]
    sizes = tuple(sides[0].us)
    for fragments in sizes:
        for side in sides:
            us = side.us[fragments]
            rows.append(
                f"| {side.name} | {fragments} | {statistics.median(us):.1f} "
                f"({min(us):.1f}-{max(us):.1f}) | {statistics.median(us) / limit:.2f}x |"
            )
    for other in sides[1:]:
        for fragments in sizes:
            new, base = (statistics.median(s.us[fragments]) for s in (sides[0], other))
            rows.append(f"| new / {other.name} | {fragments} | {new / base:.3f} | |")
    rows.append(
        f"| raw pipelined publish loop (limit) | | {limit:.1f} "
        f"({min(limits):.1f}-{max(limits):.1f}), {len(limits)} runs | 1.00x |"
    )
    return "\n".join(rows)


def main() -> None:
    """Parse the options, run, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--baseline", action="append", default=[], help="another checkout with its own .venv"
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--py-spy", help="path of a py-spy binary: also record profiles")
    parser.add_argument("--cprofile", action="store_true", help="gateways under cProfile")
    parser.add_argument("--out", default="bench/results/gateway-cpu")
    parser.add_argument("--paced", type=int, default=0, help="paced sessions per round")
    args = parser.parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.cprofile:  # 200 sessions under the profiler outlast the provider call's bounds
        gw.SESSIONS_B = 40
    print(_table(*uvloop.run(_run(args))))


if __name__ == "__main__":
    main()
