"""The deploy/nats configuration files run for real on loopback.

Only hostnames, ports and the store directory are rewritten (the rewrite is checked to touch
nothing else); the accounts, users and permissions are the committed file, unchanged.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import nats
from nats.aio.client import Client

from tests.deploy._files import NATS_DIR, NATS_USERS
from tokenwire.broker import find_binary, free_port
from tokenwire.broker._api import inbox_prefix

PASSWORDS = {user: f"test-{user}-secret" for user in NATS_USERS}
START_TIMEOUT_S = 15.0


def server_env() -> dict[str, str]:
    """The environment the server reads the users' passwords from (NATS_<USER>_PASSWORD)."""
    return {**os.environ, **{f"NATS_{u.upper()}_PASSWORD": p for u, p in PASSWORDS.items()}}


@dataclass(frozen=True)
class NodePorts:
    client: int
    http: int
    cluster: int

    @classmethod
    def free(cls) -> NodePorts:
        ports = {4222, 6222, 8222}
        while {*(chosen := (free_port(), free_port(), free_port()))} & ports or len(
            set(chosen)
        ) < 3:
            pass
        return cls(*chosen)


def loopback_config(text: str, ports: NodePorts, routes: list[int], store_dir: Path) -> str:
    """``text`` with listen addresses, route hosts and the store dir moved to loopback/tmp."""
    rules = [
        (r"listen: 0\.0\.0\.0:4222", f"listen: 127.0.0.1:{ports.client}", 1),
        (r"http: 0\.0\.0\.0:8222", f"http: 127.0.0.1:{ports.http}", 1),
        (r"listen: 0\.0\.0\.0:6222", f"listen: 127.0.0.1:{ports.cluster}", 1),
        (r"store_dir: /data/jetstream", f'store_dir: "{store_dir}"', 1),
    ]
    for pattern, replacement, expected in rules:
        text, count = re.subn(pattern, replacement, text)
        assert count == expected, f"{pattern!r} matched {count} times"

    def route(match: re.Match[str]) -> str:
        return f"nats-route://127.0.0.1:{routes[int(match.group(1)) - 1]}"

    text, count = re.subn(r"nats-route://nats-(\d):6222", route, text)
    assert count == len(routes), f"{count} routes"
    return text


def write_node_configs(workdir: Path, nodes: int = 3) -> list[tuple[Path, NodePorts]]:
    """deploy/nats/nats-<i>.conf and accounts.conf, rewritten for loopback, in ``workdir``."""
    shutil.copy(NATS_DIR / "accounts.conf", workdir / "accounts.conf")
    ports = [NodePorts.free() for _ in range(nodes)]
    routes = [p.cluster for p in ports]
    out = []
    for i, node_ports in enumerate(ports, start=1):
        text = (NATS_DIR / f"nats-{i}.conf").read_text()
        path = workdir / f"nats-{i}.conf"
        path.write_text(loopback_config(text, node_ports, routes, workdir / f"store-{i}"))
        out.append((path, node_ports))
    return out


@dataclass
class Node:
    """One nats-server process started from a config file."""

    config: Path
    ports: NodePorts
    name: str
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> Node:
        # The child keeps its own copy of the descriptor; ours closes right away.
        with (self.config.parent / f"{self.config.stem}.log").open("ab") as log:  # restarts add
            self.proc = subprocess.Popen(
                [find_binary(), "-c", str(self.config)],
                env=server_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def wait_accepting(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None
            assert self.proc.poll() is None, self.log()
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.ports.client), timeout=0.2),
            ):
                return
            time.sleep(0.05)
        raise AssertionError(f"{self.name} did not start:\n{self.log()}")

    def js_healthy(self) -> bool:
        """The node's /healthz for JetStream (what the compose health check asks)."""
        url = f"http://127.0.0.1:{self.ports.http}/healthz?js-enabled-only=true"
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def log(self) -> str:
        path = self.config.parent / f"{self.config.stem}.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    def url(self, user: str) -> str:
        return f"nats://{user}:{PASSWORDS[user]}@127.0.0.1:{self.ports.client}"


@contextlib.contextmanager
def running(nodes: list[Node]) -> Iterator[list[Node]]:
    try:
        for node in nodes:
            node.start()
        for node in nodes:
            node.wait_accepting()
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def urls_for(nodes: list[Node], user: str) -> str:
    return ",".join(node.url(user) for node in nodes)


@dataclass
class Connection:
    """A client connected as one user, keeping the asynchronous errors the server sent it."""

    nc: Client
    errors: list[str]

    def violations(self) -> list[str]:
        return [e for e in self.errors if "permissions violation" in e.lower()]


async def connect_as(user: str, urls: str) -> Connection:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    nc = await nats.connect(
        servers=urls.split(","),
        name=f"deploy-test-{user}",
        error_cb=on_error,
        connect_timeout=2,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.2,
        inbox_prefix=inbox_prefix(urls.split(",")),
    )
    return Connection(nc, errors)


async def close(conn: Connection) -> None:
    with contextlib.suppress(OSError):
        await conn.nc.close()


def run_provision(
    urls: str | None,
    replicas: int,
    timeout_s: float = 40.0,
    shards: int = 1,
    command: tuple[str, ...] | None = None,
    registry_shards: int = 1,
) -> subprocess.CompletedProcess[str]:
    """``tokenwire provision`` (or ``command``, e.g. ``("reshard",)``), with the environment
    compose's service and the Job give it (the services' ``TOKENWIRE_PROVISION=0`` included:
    it must not stop provisioning)."""
    env = {k: v for k, v in server_env().items() if not k.startswith("TOKENWIRE_")}
    env |= {
        "TOKENWIRE_REPLICAS": str(replicas),
        "TOKENWIRE_PARTITIONS": "16",
        "TOKENWIRE_PROVISION": "0",
        "TOKENWIRE_SHARDS": str(shards),
        "TOKENWIRE_REGISTRY_SHARDS": str(registry_shards),
    }
    if urls is not None:
        env["TOKENWIRE_NATS_URL"] = urls
    args = command or ("provision", "--timeout", str(timeout_s))
    return subprocess.run(
        [sys.executable, "-m", "tokenwire", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s + 60,
        check=False,
    )


def provision(urls: str, replicas: int, shards: int = 1, registry_shards: int = 1) -> None:
    """Provision as the compose service and the Kubernetes Job do; fail the test if it fails."""
    result = run_provision(urls, replicas, shards=shards, registry_shards=registry_shards)
    assert result.returncode == 0, result.stderr
    assert f"{replicas} replicas) ready" in result.stdout
