"""Every command as its own process (the installed ``tokenwire`` entry point): the first connect
to an unreachable broker or store fails within its bound with one line naming the URL (never its
password), configuration errors exit 2, and signals stop services and long commands (130/143).

The commands run against a nats-server this module starts (the default topology), a port
nothing listens on, and a PostgreSQL URL on such a port.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tokenwire.broker import EmbeddedServer, Topology, connect, ensure_topology, free_port

TOKENWIRE = str(Path(sys.executable).with_name("tokenwire"))
SECRET = "s3cret-sentinel-pw"
PARTITIONS = 4
BOUND_S = 1
"""The first-connect bound the commands get (``--connect-timeout-s``)."""
PROCESS_LIMIT_S = 90.0
"""How long a test waits for a process at most: a command that hangs fails the test."""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = EmbeddedServer(tmp_path_factory.mktemp("bounded-nats"))
    server.start()
    try:
        asyncio.run(_provision(server.url))
        yield server.url
    finally:
        server.stop()


async def _provision(url: str) -> None:
    nc = await connect(url)
    try:
        await ensure_topology(nc, Topology(partitions=PARTITIONS))
    finally:
        await nc.close()


@dataclass
class Done:
    argv: list[str]
    code: int
    out: str
    err: str

    def __str__(self) -> str:
        return f"{self.argv} -> {self.code}\nstdout: {self.out[-1500:]}\nstderr: {self.err[-1500:]}"


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENWIRE_")}
    env.update(
        TOKENWIRE_DATA_DIR=str(tmp_path / "data"),
        TOKENWIRE_PARTITIONS=str(PARTITIONS),
        TOKENWIRE_STORE=f"sqlite:///{tmp_path / 'store.db'}",
    )
    return env


async def _run(argv: list[str], env: dict[str, str]) -> Done:
    proc = await asyncio.create_subprocess_exec(
        TOKENWIRE, *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), PROCESS_LIMIT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"{argv} did not end within {PROCESS_LIMIT_S} s") from None
    assert proc.returncode is not None
    return Done(argv, proc.returncode, out.decode(), err.decode())


async def _run_all(argvs: list[list[str]], env: dict[str, str]) -> list[Done]:
    return list(await asyncio.gather(*(_run(a, env) for a in argvs)))


def _error_line(done: Done) -> str:
    """The one error line (log lines of the services may precede it)."""
    lines = [ln for ln in done.err.splitlines() if ln.startswith("tokenwire: ")]
    assert len(lines) == 1, str(done)
    return lines[0]


async def test_an_unreachable_broker_fails_every_command_within_its_bound(tmp_path: Path) -> None:
    port = free_port()
    url = f"nats://operator:{SECRET}@127.0.0.1:{port}"
    common = ["--nats-url", url, "--connect-timeout-s", str(BOUND_S)]
    argvs = [
        ["status", *common],
        ["replay", "s-1", "--max", *common],
        ["replay", "s-1", "--verify", *common],
        ["tail", "s-1", *common],
        ["rebuild", *common],
        ["provision", *common],
        ["gateway", *common],
        ["assembler", "--metrics-addr", "off", *common],
        ["telemetry", "--metrics-addr", f"127.0.0.1:{free_port()}", *common],
    ]
    for done in await _run_all(argvs, _env(tmp_path)):
        assert done.code == 1, str(done)
        line = _error_line(done)
        assert f"NATS unavailable at nats://127.0.0.1:{port}" in line, str(done)
        assert f"within {BOUND_S} s" in line, str(done)
        assert SECRET not in done.err + done.out, str(done)
        assert "operator" not in line, str(done)


async def test_an_unreachable_store_fails_within_its_bound(tmp_path: Path, broker: str) -> None:
    port = free_port()
    store = f"postgresql://tokenwire:{SECRET}@127.0.0.1:{port}/tokenwire"
    common = ["--store", store, "--connect-timeout-s", str(BOUND_S)]
    argvs = [
        ["messages", "s-1", *common],
        ["replay", "s-1", "--verify", "--nats-url", broker, *common],
        ["rebuild", "--nats-url", broker, *common],
        ["assembler", "--nats-url", broker, "--metrics-addr", "off", *common],
    ]
    for done in await _run_all(argvs, _env(tmp_path)):
        assert done.code == 1, str(done)
        line = _error_line(done)
        assert f"127.0.0.1:{port}/tokenwire" in line, str(done)
        assert "not reachable" in line, str(done)
        assert SECRET not in done.err + done.out, str(done)


async def test_configuration_errors_exit_2(tmp_path: Path, broker: str) -> None:
    env = _env(tmp_path)
    cases = {
        ("status", "--nats-url", "http://127.0.0.1:4222"): "TOKENWIRE_NATS_URL",
        ("messages", "s-1", "--store", f"mysql://u:{SECRET}@h/db"): "bad store URL",
        ("rebuild", "--nats-url", broker, "--store", "sqlite://relative.db"): "bad store URL",
        ("status", "--nats-url", broker, "--partitions", "many"): "TOKENWIRE_PARTITIONS",
        ("status", "--connect-timeout-s", "-1"): "TOKENWIRE_CONNECT_TIMEOUT_S",
        ("gateway",): "TOKENWIRE_NATS_URL",
        ("assembler",): "TOKENWIRE_NATS_URL",
        ("telemetry",): "TOKENWIRE_NATS_URL",
        ("assembler", "--nats-url", broker, "--batch-steps", "0"): "BATCH_STEPS",
        ("gateway", "--nats-url", broker, "--gateway-addr", "0.0.0.0:8080"): "loopback",
        ("replay", "bad id!", "--nats-url", broker): "invalid session id",
        ("tail", "s-1"): "no NATS server",
    }
    argvs = [list(argv) for argv in cases]
    for done, expected in zip(await _run_all(argvs, env), cases.values(), strict=True):
        assert done.code == 2, str(done)
        assert expected in _error_line(done), str(done)
        assert SECRET not in done.err, str(done)


async def test_not_found_exits_1_and_a_usage_error_of_click_exits_2(
    tmp_path: Path, broker: str
) -> None:
    env = _env(tmp_path)
    nothing, unknown = await _run_all(
        [["replay", "never-published", "--max", "--nats-url", broker], ["status", "--bogus"]], env
    )
    assert nothing.code == 1, str(nothing)
    assert "never-published" in _error_line(nothing)
    assert unknown.code == 2, str(unknown)
    assert "--bogus" in unknown.err


async def test_version() -> None:
    from importlib.metadata import version

    done = await _run(["--version"], dict(os.environ))
    assert done.code == 0, str(done)
    assert done.out.strip() == f"tokenwire, version {version('tokenwire')}"


async def _ready(proc: asyncio.subprocess.Process, marker: str) -> str:
    """stderr lines until one contains ``marker`` (bounded)."""
    assert proc.stderr is not None
    seen = ""
    async with asyncio.timeout(PROCESS_LIMIT_S):
        while marker not in seen:
            line = await proc.stderr.readline()
            assert line, f"ended before {marker!r}:\n{seen[-3000:]}"
            seen += line.decode()
    return seen


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
async def test_services_stop_on_a_signal_with_its_exit_code(
    tmp_path: Path, broker: str, sig: signal.Signals, code: int
) -> None:
    env = _env(tmp_path)
    services = {
        "assembler": (["assembler", "--metrics-addr", f"127.0.0.1:{free_port()}"], "metrics on"),
        "telemetry": (["telemetry", "--metrics-addr", f"127.0.0.1:{free_port()}"], "consuming"),
        "gateway": (["gateway", "--gateway-addr", f"127.0.0.1:{free_port()}"], "Uvicorn running"),
    }
    procs = {}
    try:
        for name, (argv, _) in services.items():
            procs[name] = await asyncio.create_subprocess_exec(
                TOKENWIRE,
                *argv,
                "--nats-url",
                broker,
                env=env,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
            )
        for name, (_, marker) in services.items():
            await _ready(procs[name], marker)
        for proc in procs.values():
            proc.send_signal(sig)
        for name, proc in procs.items():
            assert proc.stderr is not None
            async with asyncio.timeout(PROCESS_LIMIT_S):
                rest = await proc.stderr.read()
                await proc.wait()
            assert proc.returncode == code, f"{name}: {rest.decode()[-3000:]}"
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.kill()
                await proc.wait()


async def test_a_service_stops_on_sigterm_while_its_first_connect_waits(tmp_path: Path) -> None:
    """The assembler of the issue waited ~2 min: now SIGTERM ends the connect attempt at once
    (the bound given here is far longer than the test waits)."""
    url = f"nats://127.0.0.1:{free_port()}"
    proc = await asyncio.create_subprocess_exec(
        TOKENWIRE,
        "assembler",
        "--metrics-addr",
        "off",
        "--nats-url",
        url,
        "--connect-timeout-s",
        "600",
        env=_env(tmp_path),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        await _ready(proc, "connecting to")
        proc.send_signal(signal.SIGTERM)
        assert proc.stderr is not None
        async with asyncio.timeout(PROCESS_LIMIT_S):
            err = await proc.stderr.read()
            await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 143, err.decode()
    assert "stopped by SIGTERM" in err.decode()
