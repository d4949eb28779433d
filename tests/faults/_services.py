"""The fault tier's processes: ``tokenwire gateway`` and ``tokenwire assembler`` as their
deployed users (provisioned by ``tokenwire provision``, TOKENWIRE_PROVISION=0), each its own
process so it can be SIGKILLed; the scripted provider in the test's loop (never faulted)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.deploy._nats import server_env
from tokenwire.broker import free_port

READY_BOUND_S = 60.0
STOP_BOUND_S = 20.0
GATEWAY_KEY = "gwkey-SENTINEL-5b7e0d2a91"
OPENAI_KEY = "sk-SENTINEL-openai-3c9f1e"
ANTHROPIC_KEY = "sk-ant-SENTINEL-8d2a4b"
SENTINELS = (GATEWAY_KEY, OPENAI_KEY, ANTHROPIC_KEY)


@dataclass
class Service:
    """One ``tokenwire`` service process."""

    name: str
    args: list[str]
    env: dict[str, str]
    log: Path
    probe: str | None = None
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> Service:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tokenwire", *self.args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return self

    def wait_ready(self) -> Service:
        """Until the probe answers 200 (bounded; the process must stay alive)."""
        deadline = time.monotonic() + READY_BOUND_S
        while self.probe is not None and not _answers(self.probe):
            assert self.proc is not None
            assert self.proc.poll() is None, f"{self.name} exited:\n{self.text()[-3000:]}"
            assert time.monotonic() < deadline, f"{self.name} not ready:\n{self.text()[-3000:]}"
            time.sleep(0.1)
        return self

    async def ready(self) -> Service:
        return await asyncio.to_thread(self.wait_ready)

    def answers(self) -> bool:
        """Its probe answers 200 now."""
        return self.probe is not None and _answers(self.probe)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_BOUND_S)
            except subprocess.TimeoutExpired:
                self.kill()

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _base_env(
    workdir: Path, nats_urls: str, store_url: str, shards: int, registry_shards: int = 1
) -> dict[str, str]:
    env = {k: v for k, v in server_env().items() if not k.startswith("TOKENWIRE_")}
    return env | {
        "TOKENWIRE_NATS_URL": nats_urls,
        "TOKENWIRE_STORE": store_url,
        "TOKENWIRE_PROVISION": "0",
        "TOKENWIRE_PARTITIONS": "16",
        "TOKENWIRE_SHARDS": str(shards),
        "TOKENWIRE_REGISTRY_SHARDS": str(registry_shards),
        "TOKENWIRE_REPLICAS": "3",
        "TOKENWIRE_DATA_DIR": str(workdir / "data"),
    }


def gateway(
    workdir: Path,
    nats_urls: str,
    store_url: str,
    scripted_url: str,
    *,
    tag: str,
    shards: int = 1,
    registry_shards: int = 1,
    idle_s: float | None = None,
) -> Service:
    """``idle_s``: its ``max_step_idle_seconds`` (which bounds, with its ack timeout, how long
    the assembler keeps a crashed gateway's step open: docs/assembler.md)."""
    port = free_port()
    idle = {} if idle_s is None else {"TOKENWIRE_GATEWAY_MAX_STEP_IDLE_SECONDS": str(idle_s)}
    env = (
        _base_env(workdir, nats_urls, store_url, shards, registry_shards)
        | idle
        | {
            "TOKENWIRE_GATEWAY_ADDR": f"127.0.0.1:{port}",
            "TOKENWIRE_GATEWAY_KEYS": GATEWAY_KEY,
            "TOKENWIRE_SCRIPTED_BASE_URL": scripted_url,
            "OPENAI_API_KEY": OPENAI_KEY,
            "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
        }
    )
    service = Service(f"gateway-{tag}", ["gateway"], env, workdir / f"gateway-{tag}.log")
    service.probe = f"http://127.0.0.1:{port}/readyz"
    service.env["TW_TEST_BASE_URL"] = f"http://127.0.0.1:{port}"
    return service


def assembler(
    workdir: Path,
    nats_urls: str,
    store_url: str,
    *,
    tag: str,
    abandon_s: float = 5.0,
    shards: int = 1,
    registry_shards: int = 1,
) -> Service:
    port = free_port()
    env = _base_env(workdir, nats_urls, store_url, shards, registry_shards) | {
        "TOKENWIRE_ASSEMBLER_PROVISION": "0",
        "TOKENWIRE_ASSEMBLER_METRICS_ADDR": f"127.0.0.1:{port}",
        "TOKENWIRE_ASSEMBLER_ABANDON_TIMEOUT_S": str(abandon_s),
        "TOKENWIRE_ASSEMBLER_GAP_TIMEOUT_S": str(abandon_s),
        "TOKENWIRE_ASSEMBLER_TUNE_GC": "0",
    }
    service = Service(f"assembler-{tag}", ["assembler"], env, workdir / f"assembler-{tag}.log")
    service.probe = f"http://127.0.0.1:{port}/readyz"
    return service


def base_url(service: Service) -> str:
    return service.env["TW_TEST_BASE_URL"]


@contextlib.contextmanager
def running(*services: Service):
    try:
        for s in services:
            s.start()
        yield services
    finally:
        for s in services:
            s.stop()
