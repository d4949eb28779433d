"""The embedded stack behind ``demo`` and ``up``: nats-server and every service as processes.

Each service runs as ``python -m tokenwire <service>`` configured by environment, exactly as
compose or Kubernetes would run it, with its log under ``<data dir>/logs/``. ``start`` returns
once every part answers its readiness probe (bounded); ``stop`` sends SIGTERM to every child,
which exits within its stop bound (``TOKENWIRE_STOP_TIMEOUT_S``, inherited), then SIGKILL to
any still alive :data:`CHILD_MARGIN_S` later, then stops the broker: no process is left
behind, and the whole stop takes at most the bound plus :data:`STACK_MARGIN_S`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tokenwire import variables as v
from tokenwire.broker import EmbeddedServer, Topology, connect, ensure_topology, free_port
from tokenwire.cli._errors import CliError
from tokenwire.config import Settings, stop_timeout

READY_TIMEOUT_S = 60.0
CHILD_MARGIN_S = 3.0
"""How long past its own stop bound a child gets before its SIGKILL."""
BROKER_STOP_S = 5.0
"""How long the embedded nats-server gets after SIGTERM before its SIGKILL."""
STACK_MARGIN_S = 15.0
"""``up`` and ``demo`` stop within the services' stop bound plus this (the children's margin,
the broker's stop, and room to spare)."""


class StackError(CliError):
    """A part of the stack failed to start; ``log`` is where its output went."""

    def __init__(self, part: str, why: str, log: Path | None = None) -> None:
        where = f" (log: {log})" if log else ""
        super().__init__(f"{part}: {why}{where}")
        self.part = part
        self.log = log


@dataclass(kw_only=True)
class Child:
    """One service process and the URL that answers 200 once it is ready."""

    name: str
    argv: list[str]
    env: dict[str, str]
    ready_url: str
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tokenwire", *self.argv],
                env={**os.environ, **self.env},
                stdout=out,
                stderr=out,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches us, and we stop the children in order
            )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Stack:
    """nats-server, scripted provider, gateway, assembler and telemetry on loopback."""

    settings: Settings
    topology: Topology = field(default_factory=Topology)
    gateway_port: int | None = None
    scripted_rate: float = 100.0
    server: EmbeddedServer | None = None
    children: list[Child] = field(default_factory=list)
    addresses: dict[str, str] = field(default_factory=dict)

    @property
    def nats_url(self) -> str:
        assert self.server is not None
        return self.server.url

    async def start(self) -> None:
        """Start every part and wait until each is ready; on failure stop what started."""
        try:
            await self._start()
        except BaseException:
            self.stop()
            raise

    async def _start(self) -> None:
        data = self.settings.data_dir
        self.server = EmbeddedServer(data, write_url_file=True, stop_timeout_s=BROKER_STOP_S)
        self.server.start()
        self.addresses["nats"] = self.server.url
        nc = await connect(self.server.url)
        try:
            await ensure_topology(nc, self.topology)
        finally:
            await nc.close()
        self.children = self._children(data)
        for child in self.children:
            child.start()
        async with httpx.AsyncClient(timeout=2.0) as client:
            await asyncio.gather(*(self._wait_ready(client, c) for c in self.children))

    def _children(self, data: Path) -> list[Child]:
        logs = data / "logs"
        scripted, gateway = free_port(), self.gateway_port or self.settings.gateway_port
        assembler_metrics, telemetry_metrics = free_port(), free_port()
        common = {
            v.NATS_URL.env: self.server.url if self.server else "",
            v.STORE.env: self.settings.store_url,
            v.DATA_DIR.env: str(data),
            v.PARTITIONS.env: str(self.topology.partitions),
            v.SHARDS.env: str(self.topology.shards),
        }
        self.addresses.update(
            {
                "gateway": f"http://127.0.0.1:{gateway}",
                "scripted-provider": f"http://127.0.0.1:{scripted}",
                "assembler metrics": f"http://127.0.0.1:{assembler_metrics}/metrics",
                "telemetry metrics": f"http://127.0.0.1:{telemetry_metrics}/metrics",
                "store": self.settings.store_url,
            }
        )
        # A modest token rate, so that the demo streams as a provider would (8 fragments a step).
        scripted_argv = [
            "scripted-provider",
            "--host",
            "127.0.0.1",
            "--port",
            str(scripted),
            "--rate",
            str(self.scripted_rate),
        ]
        local = "http://127.0.0.1"
        return [
            Child(
                name="scripted-provider",
                argv=scripted_argv,
                env=common,
                ready_url=f"{local}:{scripted}/healthz",
                log=logs / "scripted-provider.log",
            ),
            Child(
                name="assembler",
                argv=["assembler"],
                env={**common, v.ASSEMBLER_METRICS_ADDR.env: f"127.0.0.1:{assembler_metrics}"},
                ready_url=f"{local}:{assembler_metrics}/metrics",
                log=logs / "assembler.log",
            ),
            Child(
                name="telemetry",
                argv=["telemetry"],
                env={**common, v.TELEMETRY_METRICS_ADDR.env: f"127.0.0.1:{telemetry_metrics}"},
                ready_url=f"{local}:{telemetry_metrics}/metrics",
                log=logs / "telemetry.log",
            ),
            Child(
                name="gateway",
                argv=["gateway"],
                env={
                    **common,
                    v.GATEWAY_ADDR.env: f"127.0.0.1:{gateway}",
                    "TOKENWIRE_SCRIPTED_BASE_URL": f"{local}:{scripted}/v1",
                },
                ready_url=f"{local}:{gateway}/readyz",
                log=logs / "gateway.log",
            ),
        ]

    async def _wait_ready(self, client: httpx.AsyncClient, child: Child) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if not child.alive():
                raise StackError(child.name, "exited during start-up", child.log)
            try:
                if (await client.get(child.ready_url)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
        raise StackError(child.name, f"not ready after {READY_TIMEOUT_S:.0f} s", child.log)

    def stop(self) -> None:
        """SIGTERM every child (gateway first), SIGKILL what outlives its bound, stop NATS."""
        for child in reversed(self.children):
            if child.alive() and child.proc is not None:
                child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + stop_timeout() + CHILD_MARGIN_S
        for child in self.children:
            if child.proc is None:
                continue
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()
        if self.server is not None:
            self.server.stop()
