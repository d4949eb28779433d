"""The openai npm package, from Node, drives a real gateway over a socket through an
unmodified tool loop: one session of two steps, the second threaded by its tool-call ids.

Node is optional on a developer's machine (skipped without it); under ``CI=true`` with Node
present the test fails rather than skips when the package cannot be installed. The package
is installed once per ``package.json`` into a cache folder (``npm install``, bounded)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.gateway._helpers import GATEWAY_KEY
from tests.gateway._threading_rig import threading_stack
from tokenwire.schemas import StepLink

HERE = Path(__file__).parent / "node"
NODE, NPM = shutil.which("node"), shutil.which("npm")
INSTALL_S, RUN_S = 180, 60


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true" and NODE is not None:
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def client_dir() -> Path:
    """A folder holding the client script and its installed ``openai`` package."""
    if NODE is None or NPM is None:
        _unavailable("no node / npm on this machine")
    manifest = (HERE / "package.json").read_bytes()
    digest = hashlib.sha256(manifest).hexdigest()[:12]
    folder = Path.home() / ".cache" / "tokenwire-tests" / f"node-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("package.json", "tool_loop.mjs"):
        shutil.copyfile(HERE / name, folder / name)
    if not (folder / "node_modules" / "openai").is_dir():
        result = asyncio.run(_npm_install(folder))
        if result is not None:
            _unavailable(f"npm install openai failed: {result}")
    return folder


async def _npm_install(folder: Path) -> str | None:
    assert NPM is not None
    proc = await asyncio.create_subprocess_exec(
        NPM,
        "install",
        "--no-audit",
        "--no-fund",
        "--loglevel=error",
        cwd=folder,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), INSTALL_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return f"no answer within {INSTALL_S} s"
    return None if proc.returncode == 0 else err.decode(errors="replace")[-500:]


async def test_the_openai_npm_package_tool_loop_is_one_session(
    client_dir, nats_url, nc, topology
) -> None:
    assert NODE is not None
    async with threading_stack(nats_url, nc, topology) as stack:
        proc = await asyncio.create_subprocess_exec(
            NODE,
            "tool_loop.mjs",
            stack.urls[0],
            GATEWAY_KEY,
            cwd=client_dir,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), RUN_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
        assert proc.returncode == 0, err.decode(errors="replace")[-2000:]
        first, second = (json.loads(line) for line in out.decode().splitlines())
        session = first["session"]
        parents = await stack.parents(session)
    assert (first["turn"], first["step"], first["match"]) == ("0", "0", "new")
    assert second == {
        "session": session,
        "turn": "0",
        "step": "1",
        "match": "tool-call-id",
        "parent": f"{session}/0/0",
    }
    assert parents == {(0, 0): None, (0, 1): StepLink(session, 0, 0)}
