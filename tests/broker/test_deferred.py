"""Importing the broker (and so nats-py) leaves aiohttp unloaded until something uses it: a
WebSocket transport or any other importer then gets the real module."""

from __future__ import annotations

import subprocess
import sys

CHECK = """
import asyncio, sys
import tokenwire.broker
import nats.aio.transport as transport

assert "aiohttp.client" not in sys.modules, "loaded with the broker"
assert transport.aiohttp is not None  # nats-py sees it installed

async def websocket_transport():
    ws = transport.WebSocketTransport()  # nats-py's ws:// transport: an aiohttp.ClientSession
    await ws._client.close()
    return type(ws._client).__module__

assert asyncio.run(websocket_transport()) == "aiohttp.client"
import aiohttp.web
assert type(sys.modules["aiohttp"]).__name__ == "module"
assert aiohttp.web.Application.__module__ == "aiohttp.web_app"
print("ok")
"""

FIRST_USE_IS_A_SUBMODULE = """
import tokenwire.broker
import aiohttp.web
print(aiohttp.web.Application.__module__, aiohttp.ClientSession.__module__)
"""


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_aiohttp_loads_only_when_used() -> None:
    assert _run(CHECK) == "ok"


def test_a_submodule_import_loads_the_real_package() -> None:
    assert _run(FIRST_USE_IS_A_SUBMODULE) == "aiohttp.web_app aiohttp.client"
