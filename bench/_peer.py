"""The peer: LiteLLM's proxy, installed into ``.bench-venv/`` for the benchmark only (never a
dependency of the project), one worker on a loopback port, in front of the same upstream."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil

from bench._suite import REPO
from tokenwire.broker import free_port

VERSION = os.environ.get("BENCH_LITELLM_VERSION", "1.108.7")
VENV = REPO / ".bench-venv"
INSTALL_TIMEOUT_S = 900
START_TIMEOUT_S = 180


def ensure_installed() -> Path | str:
    """The ``litellm`` executable, installing it first if needed; or why it cannot be had."""
    exe = VENV / "bin" / "litellm"
    if exe.is_file():
        return exe
    print(f"  installing litellm[proxy]=={VERSION} into {VENV} (once)", file=sys.stderr, flush=True)
    try:
        subprocess.run(["python3", "-m", "venv", str(VENV)], check=True, timeout=120)
        subprocess.run(
            [str(VENV / "bin" / "pip"), "install", "--quiet", f"litellm[proxy]=={VERSION}"],
            check=True,
            timeout=INSTALL_TIMEOUT_S,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
    except (subprocess.SubprocessError, OSError) as exc:
        return f"litellm[proxy]=={VERSION} could not be installed: {exc}"
    return exe if exe.is_file() else "litellm installed but its executable is missing"


def _config(sp_port: int, options: list[str]) -> str:
    entries = [
        f'  - model_name: "scripted/text?{o}"\n    litellm_params:\n'
        f'      model: "openai/text?{o}"\n      api_base: http://127.0.0.1:{sp_port}/v1\n'
        "      api_key: bench\n"
        for o in options
    ]
    return "model_list:\n" + "".join(entries) + "litellm_settings:\n  drop_params: true\n"


@contextlib.asynccontextmanager
async def litellm_proxy(
    exe: Path, sp_port: int, options: list[str]
) -> AsyncIterator[tuple[int, psutil.Process]]:
    """The proxy with one worker; the model names are the same ``scripted/text?...`` strings
    the gateway takes, so the callers send byte-identical requests."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="tw-bench-litellm-") as tmp:
        config = Path(tmp) / "config.yaml"
        config.write_text(_config(sp_port, options))
        env = {
            **os.environ,
            "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
            "LITELLM_LOG": "ERROR",
            "NO_PROXY": "127.0.0.1",
        }
        log = (Path(tmp) / "litellm.log").open("wb")
        proc = subprocess.Popen(  # noqa: ASYNC220 - bench start-up, not a hot path
            [
                str(exe),
                "--config",
                str(config),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--num_workers",
                "1",
            ],
            env=env,
            stdout=log,
            stderr=log,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            await _wait_live(port, proc)
            yield port, psutil.Process(proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


async def _wait_live(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"litellm exited during start-up ({proc.returncode})")
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /health/liveliness HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            ok = (await reader.read(64)).startswith(b"HTTP/1.1 200")
            writer.close()
            if ok:
                return
        except OSError:
            pass
        await asyncio.sleep(0.5)
    raise RuntimeError(f"litellm not live after {START_TIMEOUT_S} s")
