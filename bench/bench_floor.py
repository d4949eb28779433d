"""The gateway's CPU per token at 50 tokens/s against two relaying floors, in the same run.

At the capacity model's pace (50 tokens/s per session, docs/capacity.md) nearly every provider
read brings one token, and the gateway's CPU per token decides the fleet's cores. This part
measures how much of it is the gateway's own work and how much any Python process pays that
passes each token on as it arrives. Four sides stand in front of one paced scripted provider,
three processes, and run the same paced load in alternating rounds (rotated, so no side
always goes first):

- **gateway**: tokenwire's gateway with its embedded nats-server, as shipped (frames with the
  200 ms linger, the fold, bounds, metering, the caller's own stream);
- **proxy**: a bare forwarding proxy on the libraries a Python proxy is made of (uvicorn with
  httptools in front, aiohttp behind; bench_gateway's time-to-first-chunk floor). It passes
  the provider's body to the caller and does nothing else;
- **coalesced**: the same gateway, asked by each request to coalesce its provider reads
  (``x-tokenwire-coalesce-ms:`` :data:`COALESCE_MS`, ADR 0032): what a fleet that acts on
  whole messages can choose;
- **relay**: a TCP relay on uvloop protocols. It sends the request's bytes to the provider and
  each read of the response to the caller, and parses nothing. Its CPU per token is the floor
  for a Python process that relays every token on arrival: one wake-up, one read and one
  write per token.

A round is :data:`SESSIONS` callers, each streaming :data:`STEPS` steps of :data:`TOKENS`
tokens at :data:`RATE` tokens/s one after another, with the starts spread over a second (the
capacity model's load, as ``bench_gateway_cpu --paced``). A side's figure is its process's
own CPU (user + system, from ``/proc``) over the tokens streamed; the gateway's broker is not
counted (the model counts the broker on its own). A run is a fresh set of processes, a
discarded warm-up round on every side (:data:`WARM_UP`) and :data:`ROUNDS` rounds; the part
makes :data:`RUNS` runs. Each side's figure is the median over the runs of its median over a
run's rounds, each ratio the median of the runs' same-run ratios; the gateway over the bare
proxy is issue 47's target (at most 1.0x). They feed docs/capacity.md: the model's total with
the gateway's cores scaled by each floor's ratio.
Run: ``python -m bench floor`` (~9 min).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import uvloop

from bench import bench_gateway as gw
from bench._procs import cpu_s
from tokenwire.broker import EmbeddedServer, free_port

SESSIONS, STEPS, TOKENS, RATE, ROUNDS, RUNS = 150, 3, 100, 50, 4, 3
LONG_TOKENS = 400
"""Tokens of the one-step round that splits a side's CPU into a cost per step and per token."""
SPLIT_SIDES = ("gateway", "proxy")
WARM_UP = True
"""Whether a run starts with a discarded round on every side (the smoke profile's is off)."""
COALESCE_MS = 100
SIDES = ("gateway", "coalesced", "proxy", "relay")
FIGURES: dict[str, float] = {}
"""``<side>_us_per_token`` and ``<side>_over_gateway`` (medians, see the module docstring),
``gateway_over_proxy`` and each run's as ``gateway_over_proxy_<run>``."""

_RELAY = """
import asyncio, sys, uvloop

class Back(asyncio.Protocol):
    def __init__(self, caller):
        self.caller = caller
    def data_received(self, data):
        self.caller.write(data)
    def connection_lost(self, exc):
        self.caller.close()

class Relay(asyncio.Protocol):
    def connection_made(self, transport):
        self.transport, self.upstream, self.held = transport, None, []
        asyncio.get_running_loop().create_task(self._open())
    async def _open(self):
        loop = asyncio.get_running_loop()
        self.upstream, _ = await loop.create_connection(
            lambda: Back(self.transport), "127.0.0.1", int(sys.argv[2]))
        for data in self.held:
            self.upstream.write(data)
    def data_received(self, data):
        if self.upstream is None:
            self.held.append(data)
        else:
            self.upstream.write(data)
    def connection_lost(self, exc):
        if self.upstream is not None:
            self.upstream.close()

async def main():
    loop = asyncio.get_running_loop()
    server = await loop.create_server(Relay, "127.0.0.1", int(sys.argv[1]), backlog=2048)
    await server.serve_forever()

uvloop.run(main())
"""


@dataclass
class Side:
    """One process under test, the port its callers use, and its rounds' figures."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]
    headers: str = ""
    us: list[float] = field(default_factory=list)
    long_us: list[float] = field(default_factory=list)
    """CPU us per token of one round of one :data:`LONG_TOKENS` step per session."""


def scale(
    sessions: int,
    steps: int,
    rounds: int,
    runs: int = RUNS,
    long_tokens: int = LONG_TOKENS,
    warm_up: bool = True,
) -> None:
    """Sizes for a profile (``make bench-smoke`` runs a handful of sessions once, unwarmed:
    its figures only say that every side streamed)."""
    global SESSIONS, STEPS, ROUNDS, RUNS, LONG_TOKENS, WARM_UP
    SESSIONS, STEPS, ROUNDS, RUNS = sessions, steps, rounds, runs
    LONG_TOKENS, WARM_UP = long_tokens, warm_up


async def _round(side: Side, tag: str, *, steps: int = 0, tokens: int = 0) -> float:
    """One paced round on ``side`` (:data:`STEPS` steps of :data:`TOKENS` tokens a session
    unless given): its process's CPU us per token streamed."""
    steps, tokens = steps or STEPS, tokens or TOKENS
    proc = psutil.Process(side.proc.pid)
    before = cpu_s(proc)
    await gw.paced_sessions(
        side.port, SESSIONS, tag, steps=steps, tokens=tokens, rate=RATE, extra=side.headers
    )
    return (cpu_s(proc) - before) / (SESSIONS * steps * tokens) * 1e6


def _progress(what: str) -> None:
    print(f"  {time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def _start(nats_url: str, sp_port: int) -> list[Side]:
    """The four sides, three processes (the coalescing callers use the gateway's), in front of
    the scripted provider."""
    upstream = str(sp_port)
    codes = {
        "gateway": (gw._GATEWAY, nats_url, f"http://127.0.0.1:{sp_port}"),
        "proxy": (gw._PROXY, upstream),
        "relay": (_RELAY, upstream),
    }
    sides = []
    for name, (code, *args) in codes.items():
        port = free_port()
        sides.append(Side(name, port, gw._spawn(code, str(port), *args)))
    gateway = sides[0]
    coalescing = f"x-tokenwire-coalesce-ms: {COALESCE_MS}\r\n"
    sides.insert(1, Side("coalesced", gateway.port, gateway.proc, coalescing))
    return sides


async def _rounds(sides: list[Side]) -> None:
    for side in sides if WARM_UP else []:  # warm-up: imports, connections, the provider's pools
        await _round(side, f"warm-{side.name}")
    for r in range(ROUNDS):
        for side in sides[r % len(sides) :] + sides[: r % len(sides)]:
            _progress(f"round {r + 1}/{ROUNDS}: {side.name}")
            side.us.append(await _round(side, f"{side.name}-{r}"))
    for side in sides:
        if side.name in SPLIT_SIDES:
            _progress(f"one step of {LONG_TOKENS} tokens a session: {side.name}")
            side.long_us.append(
                await _round(side, f"{side.name}-long", steps=1, tokens=LONG_TOKENS)
            )


async def _run() -> list[Side]:
    with tempfile.TemporaryDirectory(prefix="tw-bench-floor-") as tmp:
        server = EmbeddedServer(Path(tmp) / "nats")
        server.start()
        sp_port = free_port()
        procs = [gw._spawn(gw._SCRIPTED, str(sp_port), str(TOKENS))]
        try:
            sides = _start(server.url, sp_port)
            procs += list({side.proc.pid: side.proc for side in sides}.values())
            for port in (sp_port, *(side.port for side in sides)):
                await gw._wait_up(port)
            await _rounds(sides)
            return sides
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(10)
            server.stop()


def _put(runs: list[list[Side]]) -> None:
    """The figures of every run (each run's sides in :data:`SIDES` order)."""
    per_run = [{side.name: statistics.median(side.us) for side in sides} for sides in runs]
    for name in SIDES:
        FIGURES[f"{name}_us_per_token"] = statistics.median(run[name] for run in per_run)
        rounds = [us for sides in runs for side in sides if side.name == name for us in side.us]
        FIGURES[f"{name}_us_min"], FIGURES[f"{name}_us_max"] = min(rounds), max(rounds)
        FIGURES[f"{name}_over_gateway"] = statistics.median(
            run[name] / run["gateway"] for run in per_run
        )
    for i, run in enumerate(per_run):
        FIGURES[f"gateway_over_proxy_{i}"] = run["gateway"] / run["proxy"]
    FIGURES["gateway_over_proxy"] = statistics.median(r["gateway"] / r["proxy"] for r in per_run)
    _put_split(runs)
    FIGURES["rounds"], FIGURES["sessions"], FIGURES["runs"] = ROUNDS, SESSIONS, len(runs)


def split(short_us: float, long_us: float, short: int, long: int) -> tuple[float, float]:
    """A side's CPU per token at steps of ``short`` and of ``long`` tokens, as a cost per
    step and a cost per token (us): ``us(n) = step / n + token``, solved from the two."""
    step = (short_us - long_us) / (1 / short - 1 / long)
    return step, long_us - step / long


def _put_split(runs: list[list[Side]]) -> None:
    """Each split side's cost per step and per token (median over the runs), and the
    gateway's cost per token over the proxy's."""
    for name in SPLIT_SIDES:
        costs = [
            split(statistics.median(side.us), side.long_us[0], TOKENS, LONG_TOKENS)
            for sides in runs
            for side in sides
            if side.name == name
        ]
        FIGURES[f"{name}_us_per_step"] = statistics.median(step for step, _ in costs)
        FIGURES[f"{name}_marginal_us_per_token"] = statistics.median(t for _, t in costs)
    FIGURES["long_tokens"] = LONG_TOKENS
    FIGURES["gateway_marginal_over_proxy"] = (
        FIGURES["gateway_marginal_us_per_token"] / FIGURES["proxy_marginal_us_per_token"]
    )


def table(figures: dict[str, float]) -> str:
    """Each side's CPU per token (median, min-max of all rounds) and its ratio to the gateway;
    then the gateway over the bare proxy, each run's and their median (target <= 1.0x)."""
    runs = int(figures.get("runs", 1))
    rows = [
        f"| side ({figures['sessions']:.0f} sessions at {RATE} tokens/s, {runs} runs of "
        f"{figures['rounds']:.0f} rounds) | CPU us per token, median (min-max) | "
        "ratio to the gateway |",
        "| --- | ---: | ---: |",
    ]
    for name in SIDES:
        low, high = figures[f"{name}_us_min"], figures[f"{name}_us_max"]
        rows.append(
            f"| {name} | {figures[f'{name}_us_per_token']:.1f} ({low:.1f}-{high:.1f}) "
            f"| {figures[f'{name}_over_gateway']:.2f}x |"
        )
    if "gateway_over_proxy" in figures:
        each = ", ".join(
            f"{figures[f'gateway_over_proxy_{i}']:.2f}x"
            for i in range(runs)
            if f"gateway_over_proxy_{i}" in figures
        )
        rows.append(
            f"| **gateway over the bare proxy** (median of {runs} runs: {each}; target <= 1.0x) "
            f"| **{figures['gateway_over_proxy']:.2f}x** | |"
        )
    if "gateway_us_per_step" in figures:
        rows += ["", *split_table(figures)]
    return "\n".join(rows)


def split_table(figures: dict[str, float]) -> list[str]:
    """The gateway's and the proxy's CPU as a cost per step and a cost per token, from the
    rounds above and one round of one long step a session."""
    long = int(figures["long_tokens"])
    rows = [
        f"Each side's CPU per token at {TOKENS} and at {long} tokens a step, solved as "
        f"us(n) = step / n + token (median of the runs):",
        "",
        "| side | per step, us | per token, us |",
        "| --- | ---: | ---: |",
    ]
    rows += [
        f"| {name} | {figures[f'{name}_us_per_step']:,.0f} | "
        f"{figures[f'{name}_marginal_us_per_token']:.1f} |"
        for name in SPLIT_SIDES
    ]
    rows.append(
        f"| gateway over the bare proxy, per token | | "
        f"{figures['gateway_marginal_over_proxy']:.2f}x |"
    )
    return rows


def main() -> str:
    runs = []
    for run in range(RUNS):
        _progress(f"run {run + 1}/{RUNS}")
        runs.append(uvloop.run(_run()))
    _put(runs)
    return table(FIGURES)
