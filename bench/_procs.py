"""Processes the suite runs: the scripted provider and bare proxy, and the full stack as
``tokenwire up`` runs it (``tokenwire.cli._stack.Stack``), optionally without the assembler and
telemetry consumer, or with the gateway started through ``bench._hooked_gateway``."""

from __future__ import annotations

import contextlib
import ctypes
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import psutil

from bench import bench_gateway as gw
from tokenwire.broker import Topology, free_port
from tokenwire.cli._stack import Child, Stack
from tokenwire.config import load

_LIBC = ctypes.CDLL(None, use_errno=True)


def cpu_s(proc: psutil.Process) -> float:
    """The process's CPU seconds, all its threads (dead ones too), from its CPU-time clock
    (``clock_getcpuclockid``: nanoseconds, where ``/proc``'s user and system time move in
    10 ms ticks, which a smoke-sized round may not reach); psutil's figure where that clock
    cannot be read."""
    clock = ctypes.c_int()
    if _LIBC.clock_getcpuclockid(proc.pid, ctypes.byref(clock)) == 0:
        with contextlib.suppress(OSError):
            return time.clock_gettime(clock.value)
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


_kept: list[dict[tuple[object, ...], tuple[RunningStack, contextlib.ExitStack]]] = []
"""The stacks each open :func:`kept_stacks` block keeps, by the arguments they were started
with (the innermost block last)."""


@contextlib.contextmanager
def kept_stacks() -> Iterator[None]:
    """Within the block, :func:`full_stack` starts each ``shared`` variant (its arguments) once
    and hands the running stack to every later caller that asks for the same variant; they
    stop when the block ends. With the smoke profile, ``python -m bench`` runs the ``stack``
    and ``interleaved`` parts in one such block, so they share the whole stack and the one
    with frames off: a smoke figure only says that its code path ran, and starting a stack
    costs more CPU than the smoke load it then serves."""
    _kept.append({})
    try:
        yield
    finally:
        with contextlib.ExitStack() as stopping:  # every one stops, whichever fails
            for _, cleanup in _kept.pop().values():
                stopping.enter_context(cleanup)


def keeping() -> bool:
    """Whether a :func:`kept_stacks` block is open."""
    return bool(_kept)


@contextlib.asynccontextmanager
async def full_stack(
    *,
    consumers: bool = True,
    hooks: dict[str, str] | None = None,
    partitions: int = 16,
    shared: bool = False,
) -> AsyncIterator[RunningStack]:
    """nats-server, scripted provider (rate 0: paced only when a request asks), gateway and,
    with ``consumers``, the assembler (SQLite) and telemetry, each its own process; ``shared``
    within :func:`kept_stacks`: the same variant's running stack if one was started there."""
    key = (consumers, tuple(sorted((hooks or {}).items())), partitions)
    kept = _kept[-1] if shared and _kept else None
    if kept is not None and key in kept:
        yield kept[key][0]
        return
    cleanup = contextlib.ExitStack()
    try:
        running = await _start_stack(cleanup, consumers, hooks, partitions)
    except BaseException:
        cleanup.close()
        raise
    if kept is not None:
        kept[key] = (running, cleanup)
        yield running
        return
    with cleanup:
        yield running


async def _start_stack(
    cleanup: contextlib.ExitStack, consumers: bool, hooks: dict[str, str] | None, partitions: int
) -> RunningStack:
    """Start the stack in a new temporary directory; ``cleanup`` stops it and removes that."""
    data = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="tw-bench-stack-")))
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
    await stack.start()  # stops what it started when it fails
    cleanup.callback(stack.stop)
    sp = int(stack.addresses["scripted-provider"].rsplit(":", 1)[1])
    procs = {c.name: psutil.Process(c.proc.pid) for c in stack.children if c.proc}
    procs["load"] = psutil.Process()
    if stack.server is not None and stack.server.pid:  # this stack's own server
        procs["nats"] = psutil.Process(stack.server.pid)
    return RunningStack(stack, port, sp, data, procs)
