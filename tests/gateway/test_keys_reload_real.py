"""``tokenwire gateway`` as a process: it logs how many keys it loaded (names, never keys or
hashes) and reads its keys file again on ``SIGHUP``; a bad file keeps the keys it had."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tokenwire.broker import EmbeddedServer, free_port

KEY_FIRST = "tw-first-SENTINEL-0123456789abcdef0123456789abcdef"
KEY_SECOND = "tw-second-SENTINEL-fedcba9876543210fedcba9876543210"
BOUND_S = 60.0


def entry(name: str, key: str) -> str:
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f'[[keys]]\nname = "{name}"\nscope = "operator"\nsha256 = "{digest}"\n\n'


def eventually(check: Callable[[], bool], what: str) -> None:
    """Wait (bounded) until ``check()`` holds."""
    deadline = time.monotonic() + BOUND_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {BOUND_S:g} s: {what}")
        time.sleep(0.05)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[str]:
    with EmbeddedServer(tmp_path / "nats") as server:
        yield server.url


def answers(url: str, key: str) -> int:
    try:
        headers = {"authorization": f"Bearer {key}"}
        return httpx.get(f"{url}/v1/sessions", headers=headers, timeout=5).status_code
    except httpx.TransportError:
        return 0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sighup_reloads_the_keys_file_and_a_bad_one_changes_nothing(
    tmp_path: Path, broker: str
) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(entry("first", KEY_FIRST))
    log = tmp_path / "gateway.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TOKENWIRE_")},
        "TOKENWIRE_NATS_URL": broker,
        "TOKENWIRE_GATEWAY_ADDR": f"127.0.0.1:{port}",
        "TOKENWIRE_GATEWAY_KEYS_FILE": str(keys),
        "TOKENWIRE_DATA_DIR": str(tmp_path),
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tokenwire", "gateway"],
            env=env,
            stdout=out,
            stderr=out,
            start_new_session=True,
        )
    try:
        eventually(lambda: answers(url, KEY_FIRST) == 200, "the gateway answering")
        assert "1 gateway key (with tenants): first" not in log.read_text()  # an operator
        assert "1 gateway key: first" in log.read_text()
        assert answers(url, KEY_SECOND) == 401

        keys.write_text(entry("first", KEY_FIRST) + entry("second", KEY_SECOND))
        proc.send_signal(signal.SIGHUP)
        eventually(lambda: answers(url, KEY_SECOND) == 200, "the second key accepted")
        assert "gateway keys reloaded on SIGHUP: 2 gateway keys: first, second" in log.read_text()

        keys.write_text("[[keys]]\nname = 'broken'\n")
        proc.send_signal(signal.SIGHUP)
        eventually(lambda: "gateway keys not reloaded" in log.read_text(), "the refusal logged")
        assert answers(url, KEY_SECOND) == 200  # the keys it had stay
        assert proc.poll() is None
        logged = log.read_text()
        for secret in (KEY_FIRST, KEY_SECOND, hashlib.sha256(KEY_FIRST.encode()).hexdigest()):
            assert secret not in logged
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    assert code == 143
