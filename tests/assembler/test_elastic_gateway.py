"""Elastic shares (ADR 0016) end to end: load through the gateway, a three-node JetStream
cluster (streams and buckets at three replicas), 16 partitions, assemblers coming and going.

100 concurrent sessions call the gateway (OpenAI wire, real sockets) in front of the scripted
provider; each session's turn k starts after membership change k, so every change happens
under load: one assembler holds all 16 partitions, two join (each ends with 5 or 6), one stops
gracefully (the others take 8 each), one is SIGKILLed (the survivor takes all 16). Sixteen
more sessions, one per partition, keep every partition busy throughout (a pin is assigned
with a delivery). The store must equal the scripted provider's ground truth
(``expected_outcome``): every turn once, in order, sequences contiguous from 1, every chunk
once with contiguous ordinals.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest
from nats.aio.client import Client

from tests.assembler.elastic import ownership, start_assembler, stop_all, wait_for_shares
from tests.assembler.elastic_load import BALANCE_BOUND_S, PARTITIONS, provision
from tests.assembler.test_failover import wait_until_settled
from tests.fixtures.broker import close_client
from tests.gateway._helpers import GATEWAY_KEY, provider_env
from tests.gateway.test_gateway_real import SCRIPTED, expected
from tokenwire.broker import EmbeddedCluster, Topology, connect, partition_of
from tokenwire.schemas import ChunkEvent, MessageEvent
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.services.scripted_provider import ScriptedServer
from tokenwire.store import Store, open_store

SESSIONS = 100
TURNS = 4
AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
Sent = dict[str, dict[int, list[dict[str, Any]]]]


async def call(client: httpx.AsyncClient, url: str, session: str, text: str) -> tuple[int, int]:
    """One streamed turn; returns (status, assigned turn). Records what was sent."""
    body = {
        "model": "scripted/text",
        "messages": [{"role": "user", "content": text}],
        "stream": True,
    }
    headers = {**AUTH, "x-tokenwire-session": session}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        await r.aread()
    return r.status_code, int(r.headers.get("x-tokenwire-turn", "-1"))


async def sessions_in_phases(
    client: httpx.AsyncClient, url: str, gates: list[asyncio.Event], sent: Sent
) -> None:
    async def one(name: str) -> None:
        for k in range(TURNS):
            await gates[k].wait()
            text = f"{name} turn {k}"
            status, turn = await call(client, url, name, text)
            assert status == 200, (name, k)
            sent[name][turn] = [{"role": "user", "content": text}]

    names = [f"user-{i:03d}" for i in range(SESSIONS)]
    for name in names:
        sent[name] = {}
    await asyncio.gather(*(one(n) for n in names))


async def keep_partitions_busy(
    client: httpx.AsyncClient, url: str, stop: asyncio.Event, sent: Sent
) -> None:
    covered: dict[int, str] = {}
    i = 0
    while len(covered) < PARTITIONS:
        covered.setdefault(partition_of(f"busy-{i}", PARTITIONS), f"busy-{i}")
        i += 1

    async def one(name: str) -> None:
        sent[name] = {}
        k = 0
        while not stop.is_set():
            text = f"{name} turn {k}"
            status, turn = await call(client, url, name, text)
            assert status == 200, (name, k)
            sent[name][turn] = [{"role": "user", "content": text}]
            k += 1

    await asyncio.gather(*(one(n) for n in covered.values()))


async def check_against_ground_truth(store: Store, sent: Sent) -> None:
    for session, turns in sent.items():
        outcomes = await store.messages(session)
        assert [(o.turn, o.step) for o in outcomes] == [(t, 0) for t in sorted(turns)], session
        seq = 1
        for outcome in outcomes:
            assert isinstance(outcome, MessageEvent), (session, outcome)
            want = expected("openai", "text", session, turns[outcome.turn])
            assert outcome.message.text == want.text, (session, outcome.turn)
            assert outcome.seq_start == seq, (session, outcome.turn)
            seq = outcome.seq_end + 1
        chunks = [e for e in await store.session_events(session) if isinstance(e, ChunkEvent)]
        assert [c.seq for c in chunks] == list(range(1, seq)), session  # none missing/doubled
        for turn in turns:
            ordinals = [c.envelope.ordinal for c in chunks if c.envelope.turn == turn]
            assert ordinals == list(range(len(ordinals))), (session, turn)


@pytest.mark.slow
@pytest.mark.postgres
async def test_assemblers_join_leave_and_crash_under_gateway_load(
    tmp_path: Path, pg_url: str
) -> None:
    topology = Topology(partitions=PARTITIONS, replicas=3, max_bytes=256 * 1024**2)
    cluster = EmbeddedCluster(tmp_path / "nats", nodes=3).start()
    nc = await connect(cluster.urls)
    store = open_store(pg_url)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = tmp_path / "logs"
    logs.mkdir()

    def start(member: str) -> None:
        procs[member] = start_assembler(
            cluster.urls, pg_url, member, logs / f"{member}.log", PARTITIONS
        )

    try:
        await provision(nc, topology)
        async with ScriptedServer(SCRIPTED) as scripted:
            gw_nc = await connect(cluster.urls)
            real = await broker_deps(gw_nc, topology)
            settings = GatewaySettings(
                port=0,
                keys=frozenset({GATEWAY_KEY}),
                provider_env=provider_env(TOKENWIRE_SCRIPTED_BASE_URL=scripted.url),
                partitions=PARTITIONS,
                ack_timeout_s=20.0,
            )
            try:
                async with GatewayServer(settings, real.deps) as gateway:
                    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
                    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
                        sent = await run_phases(nc, topology, client, gateway.url, start, procs)
            finally:
                await real.aclose()
                await close_client(gw_nc)
        total = sum(len(t) for t in sent.values())
        await wait_until_settled(nc, topology, store, total, timeout_s=90)
        await check_against_ground_truth(store, sent)
        assert (await store.stats()).steps == total
    finally:
        stop_all(list(procs.values()))
        await store.close()
        await close_client(nc)
        cluster.stop()
    assert procs["a"].returncode == 0, (logs / "a.log").read_text()[-3000:]


async def run_phases(
    nc: Client,
    topology: Topology,
    client: httpx.AsyncClient,
    url: str,
    start: Any,
    procs: dict[str, subprocess.Popen[bytes]],
) -> Sent:
    sent: Sent = {}
    gates = [asyncio.Event() for _ in range(TURNS)]
    stop = asyncio.Event()
    gates[0].set()
    load = asyncio.gather(
        sessions_in_phases(client, url, gates, sent),
        keep_partitions_busy(client, url, stop, sent),
    )
    try:
        start("a")
        await wait_for_shares(nc, topology, {"a": (16, 16)}, BALANCE_BOUND_S)
        start("b")
        start("c")
        gates[1].set()
        joined = await wait_for_shares(nc, topology, dict.fromkeys("abc", (5, 6)), BALANCE_BOUND_S)
        print(f"two joined: balanced after {joined:.1f} s")
        gates[2].set()
        procs["b"].send_signal(signal.SIGTERM)
        assert procs["b"].wait(30) == 0
        left = await wait_for_shares(nc, topology, dict.fromkeys("ac", (8, 8)), BALANCE_BOUND_S)
        print(f"graceful leave: balanced after {left:.1f} s")
        moving = [p for p, m in (await ownership(nc, topology)).items() if m == "c"]
        procs["c"].send_signal(signal.SIGKILL)
        procs["c"].wait(10)
        gates[3].set()
        crashed = await wait_for_shares(nc, topology, {"a": (16, 16)}, BALANCE_BOUND_S)
        print(f"crash: {len(moving)} partitions moved after {crashed:.1f} s")
    finally:
        for gate in gates:
            gate.set()
        stop.set()
        await load
    return sent
