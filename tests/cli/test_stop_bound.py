"""The stop bound (issue 48): SIGTERM ends every service within ``TOKENWIRE_STOP_TIMEOUT_S``
while the broker does not answer, with exit code 143, saying what it left unflushed.

Real processes: a nats-server (then SIGSTOPped: its connections stay open and nothing
answers, the harder case than a refused connection), the scripted provider, the gateway with
a step streaming through it, the assembler holding that step open, the telemetry consumer;
then ``tokenwire up`` with its own broker stopped. Each exit is waited for with a bound (the
stop bound plus a margin for a busy machine): a process that hangs fails the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from tokenwire.broker import EmbeddedServer, Topology, connect, ensure_topology, free_port

pytestmark = pytest.mark.slow

BOUND_S = 4
"""The stop bound the processes get (``TOKENWIRE_STOP_TIMEOUT_S``)."""
MARGIN_S = 15.0
"""What a loaded machine may add to the bound before the test calls a process hung."""
STACK_MARGIN_S = 15.0
"""``up`` exits within the bound plus this (docs/configuration.md, "The stop bound")."""
READY_S = 60.0
OPEN_STEPS = "tokenwire_assembler_open_steps"


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    probe: str

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def _spawn(name: str, argv: list[str], env: dict[str, str], tmp: Path, probe: str) -> Proc:
    log = tmp / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", "tokenwire", *argv],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Proc(name, popen, log, probe)


async def _ready(client: httpx.AsyncClient, proc: Proc) -> None:
    async with asyncio.timeout(READY_S):
        while True:
            assert proc.popen.poll() is None, f"{proc.name} exited:\n{proc.text()[-3000:]}"
            with contextlib.suppress(httpx.TransportError):
                if (await client.get(proc.probe)).status_code == 200:
                    return
            await asyncio.sleep(0.1)


async def _metric(client: httpx.AsyncClient, url: str, name: str) -> float:
    for line in (await client.get(url)).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


async def _exited(proc: Proc, bound_s: float) -> float:
    """Seconds until ``proc`` exited (a hang fails the test at ``bound_s``)."""
    started = time.monotonic()
    async with asyncio.timeout(bound_s):
        while proc.popen.poll() is None:  # noqa: ASYNC110 - polling another process
            await asyncio.sleep(0.05)
    return time.monotonic() - started


@contextlib.contextmanager
def _cleanup(procs: list[Proc], server: EmbeddedServer) -> Iterator[None]:
    try:
        yield
    finally:
        for proc in procs:
            if proc.popen.poll() is None:
                os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait(10)
        if server.running:
            os.kill(server.pid, signal.SIGCONT)
            server.kill()


def _env(nats_url: str, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENWIRE_")}
    return env | {
        "TOKENWIRE_NATS_URL": nats_url,
        "TOKENWIRE_PARTITIONS": "4",
        "TOKENWIRE_STORE": f"sqlite:///{tmp / 'store.db'}",
        "TOKENWIRE_DATA_DIR": str(tmp / "data"),
        "TOKENWIRE_STOP_TIMEOUT_S": str(BOUND_S),
    }


async def _stream(client: httpx.AsyncClient, url: str, got: list[str]) -> None:
    """A caller streaming a long answer (400 fragments at 20 a second)."""
    body = {
        "model": "scripted/text",
        "stream": True,
        "messages": [{"role": "user", "content": "a long answer, please"}],
    }
    with contextlib.suppress(httpx.HTTPError):
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            async for line in response.aiter_lines():
                got.append(line)


async def test_every_service_stops_within_the_bound_while_the_broker_is_stopped(
    tmp_path: Path,
) -> None:
    async with EmbeddedServer(tmp_path / "nats") as server:
        nc = await connect(server.url)
        try:
            await ensure_topology(nc, Topology(partitions=4))
        finally:
            await nc.close()
        env = _env(server.url, tmp_path)
        sp, gp, ap, tp = free_port(), free_port(), free_port(), free_port()
        local = "http://127.0.0.1"
        procs = [
            _spawn(
                "scripted",
                ["scripted-provider", "--port", str(sp), "--rate", "20", "--fragments", "400"],
                env,
                tmp_path,
                f"{local}:{sp}/healthz",
            ),
            _spawn(
                "gateway",
                ["gateway"],
                env
                | {
                    "TOKENWIRE_GATEWAY_ADDR": f"127.0.0.1:{gp}",
                    "TOKENWIRE_SCRIPTED_BASE_URL": f"{local}:{sp}/v1",
                },
                tmp_path,
                f"{local}:{gp}/readyz",
            ),
            _spawn(
                "assembler",
                ["assembler"],
                env | {"TOKENWIRE_ASSEMBLER_METRICS_ADDR": f"127.0.0.1:{ap}"},
                tmp_path,
                f"{local}:{ap}/metrics",
            ),
            _spawn(
                "telemetry",
                ["telemetry"],
                env | {"TOKENWIRE_TELEMETRY_METRICS_ADDR": f"127.0.0.1:{tp}"},
                tmp_path,
                f"{local}:{tp}/metrics",
            ),
        ]
        with _cleanup(procs, server):
            async with httpx.AsyncClient(timeout=30.0) as client:
                await asyncio.gather(*(_ready(client, p) for p in procs))
                got: list[str] = []
                caller = asyncio.create_task(_stream(client, f"{local}:{gp}", got))
                async with asyncio.timeout(READY_S):  # the step is open in the assembler
                    while await _metric(client, procs[2].probe, OPEN_STEPS) < 1:  # noqa: ASYNC110 - another process's state
                        await asyncio.sleep(0.1)
                os.kill(server.pid, signal.SIGSTOP)
                for proc in procs:
                    proc.popen.send_signal(signal.SIGTERM)
                took = await asyncio.gather(*(_exited(p, BOUND_S + MARGIN_S) for p in procs))
                caller.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await caller
    print(
        "\nstop with the broker stopped: "
        + ", ".join(
            f"{p.name} {t:.1f} s (exit {p.popen.returncode})"
            for p, t in zip(procs, took, strict=True)
        )
    )
    assert [p.popen.returncode for p in procs] == [143] * len(procs)
    gateway, assembler = procs[1].text(), procs[2].text()
    # Its drain ends at the bound less 8 s (1 s here) and names the step it cut; a stop cut
    # before that (a loaded machine) names it in the runner's report instead.
    assert (
        "1 step(s) still streaming at the stop's deadline: cancelled" in gateway
        or "left unflushed: gateway: 1 step streaming" in gateway
    ), gateway[-3000:]
    assert "left unflushed: assembler: 1 open step" in assembler
    for proc in procs:
        assert "tokenwire: stopped by SIGTERM" in proc.text(), proc.name


async def test_up_stops_within_its_bound_while_its_broker_is_stopped(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENWIRE_")}
    env |= {
        "TOKENWIRE_DATA_DIR": str(tmp_path / "data"),
        "TOKENWIRE_PARTITIONS": "4",
        "TOKENWIRE_GATEWAY_ADDR": f"127.0.0.1:{free_port()}",
        "TOKENWIRE_STOP_TIMEOUT_S": str(BOUND_S),
    }
    up = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tokenwire",
        "up",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    assert up.stdout is not None
    family: list[psutil.Process] = []
    try:
        async with asyncio.timeout(READY_S):
            while not (line := (await up.stdout.readline()).decode()).startswith("gateway:"):
                assert line, "tokenwire up ended before it was ready"
        family = psutil.Process(up.pid).children(recursive=True)
        [broker] = [p for p in family if "nats-server" in p.name()]
        broker.suspend()
        started = time.monotonic()
        up.send_signal(signal.SIGTERM)
        async with asyncio.timeout(BOUND_S + STACK_MARGIN_S + MARGIN_S):
            output = (await up.stdout.read()).decode()
            code = await up.wait()
        took = time.monotonic() - started
    finally:
        if up.returncode is None:
            os.killpg(up.pid, signal.SIGKILL)
            await up.wait()
        for child in family:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
    print(f"\nup stopped in {took:.1f} s with its broker stopped (exit {code})")
    assert code == 143, output[-3000:]
    assert not [p for p in family if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
