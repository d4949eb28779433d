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
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click
import httpx

from tokenwire import variables as v
from tokenwire.broker import EmbeddedServer, Topology, connect, ensure_topology, free_port
from tokenwire.cli._errors import CliError
from tokenwire.config import Settings, stop_timeout

F = TypeVar("F", bound=Callable[..., Any])
READY_TIMEOUT_S = 60.0
CHILD_MARGIN_S = 3.0
"""How long past its own stop bound a child gets before its SIGKILL."""
BROKER_STOP_S = 5.0
"""How long the embedded nats-server gets after SIGTERM before its SIGKILL."""
STACK_MARGIN_S = 15.0
"""``up`` and ``demo`` stop within the services' stop bound plus this (the children's margin,
the broker's stop, and room to spare)."""
_LOG_TAIL_BYTES = 64 * 1024
_LAST_WORDS_CHARS = 300


class StackError(CliError):
    """A part of the stack failed to start; ``log`` is where its output went."""

    def __init__(self, part: str, why: str, log: Path | None = None) -> None:
        where = f" (log: {log})" if log else ""
        super().__init__(f"{part}: {why}{where}")
        self.part = part
        self.log = log


class PortInUseError(StackError):
    """A port the stack was told to use is taken; ``flag`` is the option that picks another."""

    def __init__(self, part: str, *, host: str, port: int, flag: str) -> None:
        super().__init__(
            part,
            f"port {port} on {host} is in use (by another program or another `tokenwire up`); "
            f"stop it or pick another with {flag}",
        )
        self.host = host
        self.port = port
        self.flag = flag


@dataclass(frozen=True, kw_only=True)
class StackPorts:
    """The loopback ports of the stack's parts besides the gateway's (which
    ``TOKENWIRE_GATEWAY_ADDR`` sets); 0: a free one, chosen at start."""

    nats: int = 0
    scripted: int = 0
    assembler_metrics: int = 0
    telemetry_metrics: int = 0


_PORT = click.IntRange(0, 65535)


def port_flags(f: F) -> F:
    """``--nats-port``, ``--scripted-port``, ``--assembler-metrics-port`` and
    ``--telemetry-metrics-port`` (0: a free one), passed on as ``ports``; the gateway's is
    ``--gateway-addr``."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        names = ("nats", "scripted", "assembler_metrics", "telemetry_metrics")
        ports = StackPorts(**{name: kwargs.pop(f"{name}_port") for name in names})
        return f(*args, ports=ports, **kwargs)

    options = (
        ("--nats-port", "The embedded nats-server's client port."),
        ("--scripted-port", "The scripted provider's port."),
        ("--assembler-metrics-port", "The assembler's /metrics and probes."),
        ("--telemetry-metrics-port", "The telemetry consumer's /metrics."),
    )
    for flag, text in reversed(options):
        option = click.option(
            flag, type=_PORT, default=0, show_default=True, help=f"{text} 0: a free one."
        )
        wrapper = option(wrapper)
    return wrapper  # type: ignore[return-value]  # click's decorators return the wrapped command


PORT_FLAGS = {
    "nats": "--nats-port",
    "scripted-provider": "--scripted-port",
    "assembler": "--assembler-metrics-port",
    "telemetry": "--telemetry-metrics-port",
    "gateway": "--gateway-addr HOST:PORT",
}
"""The option of ``up`` (and ``demo``) that picks each part's port."""


@dataclass(kw_only=True)
class Child:
    """One service process and the URL that answers 200 once it is ready."""

    name: str
    argv: list[str]
    env: dict[str, str]
    ready_url: str
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    log_start: int = 0

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.log_start = out.tell()
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

    def last_words(self) -> str:
        """The last line this start wrote to its log (why it exited), or ``""``."""
        try:
            with self.log.open("rb") as f:
                f.seek(max(self.log_start, self.log.stat().st_size - _LOG_TAIL_BYTES))
                lines = [line.strip() for line in f.read(_LOG_TAIL_BYTES).splitlines()]
        except OSError:
            return ""
        said = [line for line in lines if line]
        return said[-1].decode(errors="replace")[-_LAST_WORDS_CHARS:] if said else ""


@dataclass
class Stack:
    """nats-server, scripted provider, gateway, assembler and telemetry on loopback."""

    settings: Settings
    topology: Topology = field(default_factory=Topology)
    gateway_port: int | None = None
    """Overrides the settings' port (the demo's free one when the configured one is taken)."""
    ports: StackPorts = field(default_factory=StackPorts)
    scripted_rate: float = 100.0
    server: EmbeddedServer | None = None
    children: list[Child] = field(default_factory=list)
    addresses: dict[str, str] = field(default_factory=dict)

    @property
    def nats_url(self) -> str:
        assert self.server is not None
        return self.server.url

    async def start(self) -> None:
        """Start every part and wait until each is ready; on failure stop what started.

        A port given (not 0) that is taken fails at once with :class:`PortInUseError`,
        before anything starts; a part that exits while starting fails with the last line
        of its log."""
        try:
            await self._start()
        except BaseException:
            self.stop()
            raise

    async def _start(self) -> None:
        data = self.settings.data_dir
        _check_free("gateway", self.settings.gateway_host, self._gateway())
        for part, port in self._fixed_ports():
            _check_free(part, "127.0.0.1", port)
        self.server = EmbeddedServer(
            data, port=self.ports.nats, write_url_file=True, stop_timeout_s=BROKER_STOP_S
        )
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

    def _fixed_ports(self) -> list[tuple[str, int]]:
        p = self.ports
        given = [
            ("nats", p.nats),
            ("scripted-provider", p.scripted),
            ("assembler", p.assembler_metrics),
            ("telemetry", p.telemetry_metrics),
        ]
        return [(part, port) for part, port in given if port]

    def _gateway(self) -> int:
        return self.gateway_port or self.settings.gateway_port

    def _children(self, data: Path) -> list[Child]:
        logs = data / "logs"
        p, gateway = self.ports, self._gateway()
        scripted = p.scripted or free_port()
        assembler_metrics = p.assembler_metrics or free_port()
        telemetry_metrics = p.telemetry_metrics or free_port()
        host = self.settings.gateway_host
        gateway_url = f"http://{_url_host(_reachable(host))}:{gateway}"
        common = {
            v.NATS_URL.env: self.server.url if self.server else "",
            v.STORE.env: self.settings.store_url,
            v.DATA_DIR.env: str(data),
            v.PARTITIONS.env: str(self.topology.partitions),
            v.SHARDS.env: str(self.topology.shards),
        }
        self.addresses.update(
            {
                "gateway": gateway_url,
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
                    v.GATEWAY_ADDR.env: f"{_url_host(host)}:{gateway}",
                    "TOKENWIRE_SCRIPTED_BASE_URL": f"{local}:{scripted}/v1",
                },
                ready_url=f"{gateway_url}/readyz",
                log=logs / "gateway.log",
            ),
        ]

    async def _wait_ready(self, client: httpx.AsyncClient, child: Child) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if not child.alive():
                said = child.last_words()
                why = f"exited during start-up: {said}" if said else "exited during start-up"
                raise StackError(child.name, why, child.log)
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


def _check_free(part: str, host: str, port: int) -> None:
    """PortInUseError unless ``port`` can be bound on ``host`` now (as the part will bind it,
    with ``SO_REUSEADDR``: a port in TIME_WAIT is free, one with a listener is not)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            raise PortInUseError(part, host=host, port=port, flag=PORT_FLAGS[part]) from None


def _reachable(host: str) -> str:
    """Where to reach a server bound on ``host`` (a wildcard: loopback)."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
