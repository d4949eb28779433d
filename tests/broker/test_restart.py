"""What provisioning creates comes back after a broker restart (issue 48): every stream,
bucket and durable consumer is file-backed, so a nats-server SIGKILLed and started again on
the same store holds them all; heartbeats stored before an outage longer than the member TTL
expire by the bucket's ``max_age`` once the server is back."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

from nats.aio.client import Client

from tests.fixtures.broker import drop_topology, fresh_topology
from tokenwire.broker import EmbeddedServer, Topology, connect, ensure_topology, publish_acked
from tokenwire.broker._api import ApiError, api_request
from tokenwire.broker._provision import members_bucket_config

BOUND_S = 30.0


def _streams(t: Topology) -> list[str]:
    return [
        *t.chunk_streams,
        *t.events_streams,
        t.dlq_stream,
        *(f"KV_{b}" for b in t.registry_buckets),
        f"KV_{t.members_bucket}",
    ]


def _consumers(t: Topology) -> list[tuple[str, str]]:
    durables = [(t.stream_of_partition(p), t.assembler_consumer(p)) for p in range(t.partitions)]
    return durables + [(s, t.telemetry_consumer) for s in t.chunk_streams]


async def _wait_jetstream(nc: Client) -> None:
    """Until the restarted server answers JetStream requests again (it loads its streams
    first; meanwhile requests go unanswered)."""
    deadline = time.monotonic() + BOUND_S
    while True:
        try:
            await api_request(nc, "$JS.API.INFO", timeout_s=1.0)
            return
        except ApiError:
            assert time.monotonic() < deadline, "JetStream did not come back"
            await asyncio.sleep(0.1)


async def test_every_provisioned_object_is_on_file_and_survives_a_sigkill(tmp_path: Path) -> None:
    t = Topology(partitions=4, shards=2, registry_shards=2, max_bytes=64 * 2**20)
    server = EmbeddedServer(tmp_path).start()
    nc = await connect(server.url)
    try:
        await ensure_topology(nc, t, member_ttl_s=2.0)
        for stream in _streams(t):
            info = await api_request(nc, f"$JS.API.STREAM.INFO.{stream}")
            assert info["config"]["storage"] == "file", stream
        await publish_acked(nc, f"$KV.{t.members_bucket}.before", b"beat")
        server.kill()
        server.start()
        await _wait_jetstream(nc)
        for stream in _streams(t):
            await api_request(nc, f"$JS.API.STREAM.INFO.{stream}")  # present: no error
        for stream, consumer in _consumers(t):
            await api_request(nc, f"$JS.API.CONSUMER.INFO.{stream}.{consumer}")
        await _expired(nc, t, "before")  # the TTL (2 s) passes: the broker drops the member
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
        server.stop()


async def _expired(nc: Client, t: Topology, member: str) -> None:
    subject = f"$KV.{t.members_bucket}.{member}"
    deadline = time.monotonic() + BOUND_S
    while True:
        info = await api_request(
            nc, f"$JS.API.STREAM.INFO.KV_{t.members_bucket}", {"subjects_filter": subject}
        )
        if not (info.get("state") or {}).get("subjects"):
            return
        assert time.monotonic() < deadline, "the stale heartbeat never expired"
        await asyncio.sleep(0.1)


async def test_a_membership_bucket_in_memory_is_moved_to_file(nc: Client) -> None:
    t = fresh_topology()
    old = members_bucket_config(t, 6.0) | {"storage": "memory"}  # as provisioned before
    await api_request(nc, f"$JS.API.STREAM.CREATE.{old['name']}", old)
    try:
        await ensure_topology(nc, t)
        info = await api_request(nc, f"$JS.API.STREAM.INFO.{old['name']}")
        assert info["config"]["storage"] == "file"
        await ensure_topology(nc, t)  # and again: nothing to move
    finally:
        await drop_topology(nc, t)
