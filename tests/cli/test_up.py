"""``tokenwire up``: every port a flag, honoured; a port in use named on the console at once."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tokenwire.broker import free_port
from tokenwire.cli import main

PORT_FLAGS = (
    "--nats-port",
    "--scripted-port",
    "--assembler-metrics-port",
    "--telemetry-metrics-port",
)


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port another program listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in (
        "TOKENWIRE_NATS_URL",
        "TOKENWIRE_STORE",
        "TOKENWIRE_GATEWAY_ADDR",
        "TOKENWIRE_GATEWAY_KEYS",
        "TOKENWIRE_GATEWAY_KEYS_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TOKENWIRE_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


@pytest.mark.parametrize("flag", [*PORT_FLAGS, "--gateway-addr"])
def test_a_port_in_use_is_named_with_the_flag_that_moves_it(
    clean_env: Path, taken: int, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    value = f"127.0.0.1:{taken}" if flag == "--gateway-addr" else str(taken)
    other = [] if flag == "--gateway-addr" else ["--gateway-addr", f"127.0.0.1:{free_port()}"]
    assert main(["up", flag, value, *other]) == 1
    err = capsys.readouterr().err
    assert f"port {taken} on 127.0.0.1 is in use" in err
    assert flag in err
    assert len(err.strip().splitlines()) == 1
    assert not (clean_env / "nats.url").exists()  # refused before anything started


def _addresses(proc: subprocess.Popen[str], parts: int, bound_s: float) -> dict[str, str]:
    """The ``part: address`` lines ``up`` prints once ready (bounded)."""
    assert proc.stdout is not None
    found: dict[str, str] = {}
    deadline = time.monotonic() + bound_s
    while len(found) < parts and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        part, sep, address = line.strip().partition(": ")
        if sep and " " not in address:
            found[part] = address
    return found


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_up_listens_on_every_port_it_is_given(clean_env: Path) -> None:
    nats, scripted, assembler, telemetry, gateway = (free_port() for _ in range(5))
    argv = [
        sys.executable,
        "-m",
        "tokenwire",
        "up",
        "--nats-port",
        str(nats),
        "--scripted-port",
        str(scripted),
        "--assembler-metrics-port",
        str(assembler),
        "--telemetry-metrics-port",
        str(telemetry),
        "--gateway-addr",
        f"127.0.0.1:{gateway}",
    ]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=dict(os.environ),
        start_new_session=True,
    )
    try:
        shown = _addresses(proc, parts=6, bound_s=90)
        assert shown["nats"] == f"nats://127.0.0.1:{nats}"
        assert shown["gateway"] == f"http://127.0.0.1:{gateway}"
        assert shown["scripted-provider"] == f"http://127.0.0.1:{scripted}"
        assert shown["assembler metrics"] == f"http://127.0.0.1:{assembler}/metrics"
        assert shown["telemetry metrics"] == f"http://127.0.0.1:{telemetry}/metrics"
        for url in (
            f"http://127.0.0.1:{gateway}/readyz",
            f"http://127.0.0.1:{scripted}/healthz",
            shown["assembler metrics"],
            shown["telemetry metrics"],
        ):
            assert httpx.get(url, timeout=5).status_code == 200, url
        assert (clean_env / "nats.url").read_text().strip() == shown["nats"]
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        assert proc.stdout is not None
        proc.stdout.close()
    assert code == 130
