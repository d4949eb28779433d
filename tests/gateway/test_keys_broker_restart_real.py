"""The keys bucket across a broker restart (ADR 0041): while the broker is away the gateway
keeps the keys it had and says so (``/readyz``: ``keys-stale`` once its check goes
unanswered); once the broker is back its watch is renewed and a revoke made after the restart
is applied, without a gateway restart.

Real parts: one nats-server stopped and started again on its file store, the gateway on a
real socket (in process, its real broker dependencies), httpx over the socket.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from tests.fixtures.broker import close_client
from tests.gateway._helpers import GATEWAY_KEY, provider_env
from tokenwire.broker import EmbeddedServer, KeysBucket, Topology, connect, ensure_topology
from tokenwire.schemas import KeyRecord
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps

pytestmark = pytest.mark.slow

AGENT = "tw-agent-" + "d" * 40
BOUND_S = 60.0


async def poll(check: Callable[[], Awaitable[bool]], what: str) -> float:
    """Wait (bounded) until ``await check()`` holds; the monotonic time it first held."""
    deadline = time.monotonic() + BOUND_S
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {BOUND_S:g} s: {what}")
        await asyncio.sleep(0.02)
    return time.monotonic()


@pytest.mark.timeout(240)
async def test_the_watch_survives_a_broker_restart_and_the_last_keys_stay_meanwhile(
    tmp_path: Path,
) -> None:
    server = EmbeddedServer(tmp_path / "nats").start()
    nc = await connect(server.url)
    topology = Topology()
    await ensure_topology(nc, topology)
    book = KeysBucket(nc, topology.keys_bucket)
    record = KeyRecord(name="agent", sha256=hashlib.sha256(AGENT.encode()).hexdigest())
    assert await book.write("key", "agent", record, expected=0) is not None
    real = await broker_deps(nc, topology)
    settings = GatewaySettings(
        port=0, keys=frozenset({GATEWAY_KEY}), provider_env=provider_env(), ack_timeout_s=5.0
    )
    try:
        async with (
            GatewayServer(settings, real.deps) as gateway,
            httpx.AsyncClient(base_url=gateway.url, timeout=10) as client,
        ):

            async def status(key: str) -> int:
                headers = {"authorization": f"Bearer {key}"}
                return (await client.get("/v1/models", headers=headers)).status_code

            async def reasons() -> list[str]:
                answer = await client.get("/readyz")
                return [] if answer.status_code == 200 else answer.json()["reasons"]

            assert await status(AGENT) == 200
            assert await reasons() == []

            server.stop()
            await poll(lambda: _has(reasons, "keys-stale"), "keys-stale said")
            assert await status(AGENT) == 200  # the last keys stay

            restarted = time.monotonic()
            server.start()
            ready = await poll(lambda: _empty(reasons), "ready again")
            held = await book.entry("key", "agent")  # the key outlived the restart
            assert held is not None
            assert held.record == record
            assert await book.write("key", "agent", None, expected=held.revision)
            revoked = time.monotonic()
            refused = await poll(lambda: _is(status, AGENT, 401), "the revoke applied")
            assert await status(GATEWAY_KEY) == 200
        print(
            f"\nrestart->ready {ready - restarted:.3f} s; revoke->refused {refused - revoked:.3f} s"
        )
    finally:
        await real.aclose()
        await close_client(nc)
        server.stop()


async def _has(reasons: Callable[[], Awaitable[list[str]]], reason: str) -> bool:
    return reason in await reasons()


async def _empty(reasons: Callable[[], Awaitable[list[str]]]) -> bool:
    return not await reasons()


async def _is(status: Callable[[str], Awaitable[int]], key: str, code: int) -> bool:
    return await status(key) == code
