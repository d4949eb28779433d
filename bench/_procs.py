"""Processes the suite runs: the scripted provider and bare proxy, and the full stack as
``tokenwire up`` runs it (``tokenwire.cli._stack.Stack``), optionally without the assembler and
telemetry consumer, or with the gateway started through ``bench._hooked_gateway``."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from bench import bench_gateway as gw
from tokenwire.broker import Topology, free_port
from tokenwire.cli._stack import Child, Stack
from tokenwire.config import load


def cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


@contextlib.asynccontextmanager
async def scripted_and_proxy() -> AsyncIterator[tuple[int, int, dict[str, psutil.Process]]]:
    """The scripted provider (unpaced unless asked) and the bare proxy in front of it."""
    sp_port, px_port = free_port(), free_port()
    scripted = gw._spawn(gw._SCRIPTED, str(sp_port), str(gw.FRAGMENTS_B))
    proxy = gw._spawn(gw._PROXY, str(px_port), str(sp_port))
    try:
        for port in (sp_port, px_port):
            await gw._wait_up(port)
        procs = {
            "scripted": psutil.Process(scripted.pid),
            "proxy": psutil.Process(proxy.pid),
            "load": psutil.Process(),
        }
        yield sp_port, px_port, procs
    finally:
        for proc in (scripted, proxy):
            proc.terminate()
            proc.wait(10)


@dataclass
class HookedChild(Child):
    """The gateway started by ``python -m bench._hooked_gateway`` (same settings, same env)."""

    def start(self) -> None:
        import subprocess

        self.log.parent.mkdir(parents=True, exist_ok=True)
        repo = Path(__file__).resolve().parents[1]
        env = {**os.environ, **self.env, "PYTHONPATH": f"{repo}:{repo / 'src'}"}
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bench._hooked_gateway", *self.argv],
                env=env,
                stdout=out,
                stderr=out,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )


@dataclass
class BenchStack(Stack):
    """``Stack`` with the consumers optional and the gateway hookable (client, marks)."""

    consumers: bool = True
    hooks: dict[str, str] | None = None

    def _children(self, data: Path) -> list[Child]:
        children = super()._children(data)
        if not self.consumers:
            children = [c for c in children if c.name not in ("assembler", "telemetry")]
        if self.hooks:
            children = [
                HookedChild(
                    name=c.name,
                    argv=c.argv,
                    env={**c.env, **self.hooks},
                    ready_url=c.ready_url,
                    log=c.log,
                )
                if c.name == "gateway"
                else c
                for c in children
            ]
        return children


@dataclass
class RunningStack:
    stack: BenchStack
    gateway_port: int
    scripted_port: int
    data: Path
    procs: dict[str, psutil.Process]


@contextlib.asynccontextmanager
async def full_stack(
    *, consumers: bool = True, hooks: dict[str, str] | None = None, partitions: int = 16
) -> AsyncIterator[RunningStack]:
    """nats-server, scripted provider (rate 0: paced only when a request asks), gateway and,
    with ``consumers``, the assembler (SQLite) and telemetry, each its own process."""
    with tempfile.TemporaryDirectory(prefix="tw-bench-stack-") as tmp:
        data = Path(tmp)
        settings = replace(load({"TOKENWIRE_DATA_DIR": str(data)}), partitions=partitions)
        port = free_port()
        stack = BenchStack(
            settings,
            Topology(partitions=partitions),
            gateway_port=port,
            scripted_rate=0.0,
            consumers=consumers,
            hooks=hooks,
        )
        await stack.start()
        try:
            sp = int(stack.addresses["scripted-provider"].rsplit(":", 1)[1])
            procs = {c.name: psutil.Process(c.proc.pid) for c in stack.children if c.proc}
            procs["load"] = psutil.Process()
            if stack.server is not None and stack.server.pid:  # this stack's own server
                procs["nats"] = psutil.Process(stack.server.pid)
            yield RunningStack(stack, port, sp, data, procs)
        finally:
            stack.stop()
