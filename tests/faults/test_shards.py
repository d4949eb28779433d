"""Sharded chunk streams on a real three-node cluster (deploy/nats on loopback, R3), K = 4:
the shard leaders sit on at least two nodes, a load of sessions through the real gateway and
assembler (processes, as their deployed users) lands on all four streams, and SIGKILL of the
node leading the most shards, mid-load, loses nothing and doubles nothing: every session's
stored messages equal the scripted ground truth and replay verification passes for each;
provisioning again spreads the leaders the survivors took over. The step registry is
sharded too (R = 3 buckets, each a raft group of its own), and so are the session events
(R = 3 streams), so the kill also takes registry and events leaders: assignments ride out
their elections, and every bucket and every events stream took sessions.

CI runs it small (``TOKENWIRE_FAULTS_SHARD_SESSIONS``, 24); the measured run uses 200.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import pytest
from nats.aio.client import Client

from tests.deploy._nats import close, connect_as, provision
from tests.faults import _services as svc
from tests.faults._cluster import Cluster
from tests.faults._load import SCRIPTED, Load, _size, check, percentiles, wait_drained
from tests.faults._report import record
from tokenwire.broker import Topology, free_port, shard_leaders, stream_info
from tokenwire.services.scripted_provider import ScriptedServer
from tokenwire.store import open_store

SHARDS = 4
REGISTRY_SHARDS = 3
TOPOLOGY = Topology(partitions=16, shards=SHARDS, replicas=3, registry_shards=REGISTRY_SHARDS)
SESSIONS = int(_size("TOKENWIRE_FAULTS_SHARD_SESSIONS", 24, 4))
CASE_BOUND_S = 240.0 + 2 * SESSIONS


@pytest.mark.slow
async def test_four_shards_spread_take_the_load_and_survive_a_leader_node_kill(
    tmp_path: Path,
) -> None:
    cluster = Cluster.start(tmp_path)
    try:
        await cluster.wait_healthy()
        await asyncio.to_thread(provision, cluster.urls("provisioner"), 3, SHARDS, REGISTRY_SHARDS)
        await asyncio.wait_for(_case(tmp_path, cluster), CASE_BOUND_S)
    finally:
        cluster.stop()


async def _case(workdir: Path, cluster: Cluster) -> None:
    conn = await connect_as("operator", cluster.urls("operator"))
    operator = conn.nc
    leaders = await shard_leaders(operator, TOPOLOGY)
    per_node = Counter(leaders.values())
    registry_leaders = {b: await _leader(operator, f"KV_{b}") for b in TOPOLOGY.registry_buckets}
    assert len(set(registry_leaders.values())) >= 2, registry_leaders  # spread as the shards are
    events_leaders = {s: await _leader(operator, s) for s in TOPOLOGY.events_streams}
    assert len(set(events_leaders.values())) >= 2, events_leaders  # and the events streams
    assert len(per_node) >= 2, leaders  # one raft group per shard, spread by provisioning
    assert max(per_node.values()) <= 2, leaders  # ceil(4 shards / 3 nodes)
    store_url = f"sqlite:///{workdir / 'store.db'}"
    port = free_port()
    scripted_url = f"http://127.0.0.1:{port}"
    gateway = svc.gateway(
        workdir,
        cluster.urls("gateway"),
        store_url,
        scripted_url,
        tag="k",
        shards=SHARDS,
        registry_shards=REGISTRY_SHARDS,
    )
    # the abandonment timeout must outlast an election (see docs/reliability.md)
    assembler = svc.assembler(
        workdir,
        cluster.urls("assembler"),
        store_url,
        tag="k",
        abandon_s=60.0,
        shards=SHARDS,
        registry_shards=REGISTRY_SHARDS,
    )
    store = open_store(store_url)
    load = Load(tag="k4", sessions=SESSIONS)
    try:
        with svc.running(gateway, assembler):
            await gateway.ready()
            await assembler.ready()
            async with ScriptedServer(SCRIPTED, port=port):
                running = asyncio.create_task(load.run(svc.base_url(gateway)))
                await load.first_turn_done.wait()
                victim = cluster.node(per_node.most_common(1)[0][0])
                killed_at = time.monotonic()
                victim.kill()
                await running
                outage_s = time.monotonic() - killed_at
                victim.start()
                victim.wait_accepting()
                await cluster.wait_healthy()
            await wait_drained(store, load)
        tally = await check(store, load, operator, TOPOLOGY)
        messages = {s: await _messages(operator, s) for s in TOPOLOGY.chunk_streams}
        registry = {b: await _messages(operator, f"KV_{b}") for b in TOPOLOGY.registry_buckets}
        events = {s: await _messages(operator, s) for s in TOPOLOGY.events_streams}
        after = await shard_leaders(operator, TOPOLOGY)  # the survivors took the victim's
        # Provisioning again (idempotent) spreads them once more.
        await asyncio.to_thread(provision, cluster.urls("provisioner"), 3, SHARDS, REGISTRY_SHARDS)
        respread = Counter((await shard_leaders(operator, TOPOLOGY)).values())
        failures = Counter(r.error[:200] for r in load.results if not r.ok)
        record(
            f"K={SHARDS} shards, R3: SIGKILL of the node leading the most shards, restart",
            "0 lost, 0 duplicated, verify ok; leaders on 2+ nodes; every shard used",
            victim=victim.name,
            victim_led=per_node[victim.name],
            sessions=SESSIONS,
            steps_ok=tally.ok,
            steps_failed=tally.failed,
            stored=tally.stored_messages,
            errors_stored=tally.stored_errors,
            chunks=tally.chunks,
            lost=tally.lost,
            duplicated=tally.duplicated,
            wrong=tally.wrong,
            verified=tally.verified,
            outage_s=round(outage_s, 1),
            latency_s={k: round(v, 2) for k, v in percentiles(load.latencies()).items()},
            leaders_before=dict(per_node),
            leaders_after=dict(Counter(after.values())),
            leaders_reprovisioned=dict(respread),
            messages_per_stream=messages,
            registry_leaders=registry_leaders,
            registry_keys_per_bucket=registry,
            events_leaders=events_leaders,
            events_per_stream=events,
            failures=dict(failures),
        )
        assert all(n > 0 for n in messages.values()), messages  # every shard took sessions
        assert all(n > 0 for n in registry.values()), registry  # every registry bucket too
        assert all(n > 0 for n in events.values()), events  # and every events stream
        # every committed step announced once, through the events leader's death too
        assert sum(events.values()) == tally.stored_messages + tally.stored_errors, events
        assert len(respread) >= 2, respread
        assert max(respread.values()) <= 2, respread
        assert tally.differences == [], (failures, tally.differences)
        assert (tally.lost, tally.duplicated, tally.wrong) == (0, 0, 0)
        assert tally.verified == SESSIONS
        assert not failures, failures
        assert tally.stored_errors == 0
    finally:
        await store.close()
        await close(conn)


async def _leader(operator: Client, stream: str) -> str:
    info = await stream_info(operator, stream)
    return str((info.get("cluster") or {}).get("leader"))


async def _messages(operator: Client, stream: str) -> int:
    info = await stream_info(operator, stream)
    return int(info["state"]["messages"])
