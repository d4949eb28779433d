"""KvWriter on a real KV bucket: its revisions and refusals agree with nats-py's KeyValue."""

from __future__ import annotations

import pytest
from nats.aio.client import Client

from tests.fixtures.broker import close_client
from tokenwire.broker import StepRegistryError, Topology, connect
from tokenwire.broker._kvwrite import KvWriter


async def test_create_succeeds_once_with_the_revision_the_bucket_reports(
    nc: Client, topology: Topology
) -> None:
    writer = await KvWriter(nc, topology.steps_bucket).start()
    kv = await nc.jetstream().key_value(topology.steps_bucket)
    revision = await (await writer.put_if("k1", b"first", last=0))
    entry = await kv.get("k1")
    assert (revision, entry.value) == (entry.revision, b"first")
    assert await (await writer.put_if("k1", b"second", last=0)) is None  # it exists
    assert (await kv.get("k1")).value == b"first"
    await writer.close()


async def test_update_needs_the_current_revision(nc: Client, topology: Topology) -> None:
    writer = await KvWriter(nc, topology.steps_bucket).start()
    kv = await nc.jetstream().key_value(topology.steps_bucket)
    first = await kv.create("k2", b"v1")
    assert await (await writer.put_if("k2", b"v2", last=first + 1000)) is None  # stale
    second = await (await writer.put_if("k2", b"v2", last=first))
    entry = await kv.get("k2")
    assert (second, entry.value) == (entry.revision, b"v2")
    assert second is not None
    assert second > first
    await writer.close()


async def test_a_missing_bucket_is_a_registry_error(nc: Client) -> None:
    writer = await KvWriter(nc, "no-such-bucket").start()
    with pytest.raises(StepRegistryError, match="status 503"):
        await (await writer.put_if("k", b"v", last=0))
    await writer.close()


async def test_a_closed_connection_fails_the_write_at_once(
    nats_url: str, topology: Topology
) -> None:
    client = await connect(nats_url)
    writer = await KvWriter(client, topology.steps_bucket).start()
    await close_client(client)
    with pytest.raises(StepRegistryError):
        await writer.put_if("k", b"v", last=0)
