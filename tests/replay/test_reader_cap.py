"""The reader cap holds for a tenant's burst (issue 48): the real gateway on a socket, a real
nats-server, a named tenant key from a keys file.

A tenant key's events request looks the session's owner up on the broker (an awaited request)
before it streams. The cap was checked before that lookup and counted after it, so a burst of
100 readers against a cap of 20 opened all of them; an operator key (no lookup) was capped
exactly. Now the slot is taken before the first await and given back on every way out.
"""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from nats.aio.client import Client
from starlette.requests import Request

from tests.gateway._helpers import provider_env
from tests.replay.sessions import envelopes, publish
from tokenwire.broker import BrokerUnavailable, Topology
from tokenwire.replay import SseStats, events_router
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.store import MemoryStore

CAP = 20
BURST = 100
KEY = "tw-team-a-SENTINEL-5c4b3a29180716253443526170819203"


def _keys_file(path: Path) -> Path:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    path.write_text(f'[[keys]]\nname = "team-a-ci"\ntenant = "team-a"\nsha256 = "{digest}"\n')
    return path


async def _until(condition: Callable[[], bool], bound_s: float = 30.0) -> None:
    async with asyncio.timeout(bound_s):
        while not condition():  # noqa: ASYNC110 - polling state owned by other tasks
            await asyncio.sleep(0.02)


async def test_a_tenant_burst_of_100_readers_opens_exactly_the_cap(
    nc: Client, topology: Topology, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    mine, theirs = f"cap-a-{tag}", f"cap-b-{tag}"
    owned = [msgspec.structs.replace(e, tenant="team-a") for e in envelopes(mine)]
    other = [msgspec.structs.replace(e, tenant="team-b") for e in envelopes(theirs)]
    await publish(nc, topology, [*owned, *other])

    env = {
        "TOKENWIRE_GATEWAY_KEYS_FILE": str(_keys_file(tmp_path / "keys.toml")),
        "TOKENWIRE_GATEWAY_ADDR": "127.0.0.1:0",
    }
    settings = replace(
        GatewaySettings.from_env(env), provider_env=provider_env(), partitions=topology.partitions
    )
    store, stats = MemoryStore(), SseStats()
    real = await broker_deps(nc, topology)
    routes = events_router(lambda: nc, topology, lambda: store, stats=stats, max_readers=CAP).routes
    release = asyncio.Event()
    statuses: list[int] = []
    try:
        async with GatewayServer(settings, replace(real.deps, extra_routes=routes)) as server:
            limits = httpx.Limits(max_connections=BURST + 10)
            headers = {"authorization": f"Bearer {KEY}"}
            async with httpx.AsyncClient(
                base_url=server.url, headers=headers, limits=limits, timeout=60.0
            ) as client:

                async def read(session: str) -> None:
                    async with client.stream("GET", f"/v1/sessions/{session}/events") as r:
                        statuses.append(r.status_code)
                        if r.status_code == 200:
                            await release.wait()  # a live reader: it stays open

                readers = [asyncio.create_task(read(mine)) for _ in range(BURST)]
                await _until(lambda: len(statuses) == BURST)
                opened = statuses.count(200)
                assert stats.clients == opened
                # Another tenant's session is a 404 after the same lookup: it gives its slot back.
                strangers = [asyncio.create_task(read(theirs)) for _ in range(10)]
                await _until(lambda: len(statuses) == BURST + 10)
                release.set()
                await asyncio.gather(*readers, *strangers)
                await _until(lambda: stats.clients == 0)
    finally:
        release.set()
        await real.aclose()
    print(
        f"\nburst of {BURST} tenant readers, cap {CAP}: {opened} opened, "
        f"{statuses[:BURST].count(503)} refused"
    )
    assert (opened, statuses[:BURST].count(503)) == (CAP, BURST - CAP)
    assert stats.refused >= BURST - CAP
    assert set(statuses[BURST:]) <= {404, 503}


class _Tenant:
    operator = False
    tenant = "team-a"


def _request(session: str) -> Request:
    scope = {
        "type": "http",
        "method": "GET",
        "path": f"/v1/sessions/{session}/events",
        "path_params": {"session": session},
        "query_string": b"",
        "headers": [],
        "state": {"caller": _Tenant()},
    }
    return Request(scope)


async def test_a_reader_cancelled_or_failed_during_its_lookup_gives_its_slot_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The slot is held from before the owner lookup; a lookup that is cancelled (the client
    left) or fails (the broker) gives it back, so the cap never shrinks by leaks."""
    from tokenwire.replay import _http

    asked = asyncio.Event()
    outcome: dict[str, BaseException] = {}

    async def lookup(*_: object) -> None:
        asked.set()
        if "error" in outcome:
            raise outcome["error"]
        await asyncio.Event().wait()  # the broker never answers

    monkeypatch.setattr(_http, "session_owner", lookup)
    stats = SseStats()
    no_broker: Any = object  # the lookup is replaced: nothing reads the broker
    router = events_router(no_broker, Topology(), MemoryStore, stats=stats, max_readers=1)
    events = next(r for r in router.routes if r.path.endswith("/events")).endpoint  # type: ignore[attr-defined]  # starlette Route

    waiting = asyncio.create_task(events(_request("s-1")))
    await asyncio.wait_for(asked.wait(), 10)
    assert stats.clients == 1
    refused = await events(_request("s-2"))  # the one slot is taken during the lookup
    assert refused.status_code == 503
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert stats.clients == 0

    outcome["error"] = BrokerUnavailable("nats://x", "down")
    failed = await events(_request("s-1"))
    assert (failed.status_code, stats.clients) == (503, 0)
