"""``Restorer`` on the real server: what the broker says is missing is created again (once
per interval, create only: an object that exists keeps its settings), a consumer whose
stream is gone is not, and a process that provisions provisions again."""

from __future__ import annotations

import dataclasses

from nats.aio.client import Client

from tests.fixtures.broker import drop_topology, fresh_topology
from tokenwire.broker import Restorer, Topology, ensure_topology
from tokenwire.broker._api import ApiError, api_request


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _exists(nc: Client, subject: str) -> bool:
    try:
        await api_request(nc, subject)
    except ApiError:
        return False
    return True


async def test_a_missing_membership_bucket_is_created_again_once_per_interval(
    nc: Client, topology: Topology
) -> None:
    clock = Clock()
    restorer = Restorer(nc, topology, interval_s=5.0, clock=clock)
    stream = f"KV_{topology.members_bucket}"
    assert await restorer.members(member_ttl_s=6.0) == "present"
    await api_request(nc, f"$JS.API.STREAM.DELETE.{stream}")
    assert await restorer.members(member_ttl_s=6.0) == "later"  # tried 0 s ago
    clock.now = 5.0
    assert await restorer.members(member_ttl_s=6.0) == "restored"
    info = await api_request(nc, f"$JS.API.STREAM.INFO.{stream}")
    assert info["config"]["storage"] == "file"
    assert info["config"]["max_age"] == 6_000_000_000
    assert restorer.restored == 1


async def test_a_missing_partition_consumer_is_created_again_with_the_settings_given(
    nc: Client, topology: Topology
) -> None:
    restorer = Restorer(nc, topology, interval_s=0.0)
    name, stream = topology.assembler_consumer(1), topology.stream_of_partition(1)
    await api_request(nc, f"$JS.API.CONSUMER.DELETE.{stream}.{name}")
    restore = restorer.assembler_consumer
    assert await restore(1, ack_wait_s=42.0, max_deliver=7, priority_timeout_s=3.0) == "restored"
    config = (await api_request(nc, f"$JS.API.CONSUMER.INFO.{stream}.{name}"))["config"]
    assert (config["ack_wait"], config["max_deliver"]) == (42_000_000_000, 7)
    assert config["priority_groups"] == [topology.assembler_group]
    # one that exists keeps what provisioning set, whatever the caller would create
    assert await restore(1, ack_wait_s=1.0, max_deliver=1, priority_timeout_s=1.0) == "present"
    config = (await api_request(nc, f"$JS.API.CONSUMER.INFO.{stream}.{name}"))["config"]
    assert config["ack_wait"] == 42_000_000_000


async def test_a_missing_telemetry_consumer_is_created_again(
    nc: Client, topology: Topology
) -> None:
    restorer = Restorer(nc, topology, interval_s=0.0)
    stream, name = topology.chunk_streams[0], topology.telemetry_consumer
    await api_request(nc, f"$JS.API.CONSUMER.DELETE.{stream}.{name}")
    assert await restorer.telemetry_consumer(stream) == "restored"
    config = (await api_request(nc, f"$JS.API.CONSUMER.INFO.{stream}.{name}"))["config"]
    assert config["filter_subject"] == topology.first_chunks_filter


async def test_a_consumer_whose_stream_is_gone_is_not_created(nc: Client) -> None:
    t = fresh_topology()
    restorer = Restorer(nc, t, interval_s=0.0)
    assert (
        await restorer.assembler_consumer(
            0, ack_wait_s=30.0, max_deliver=10, priority_timeout_s=5.0
        )
        == "failed"
    )
    assert not await _exists(nc, f"$JS.API.STREAM.INFO.{t.stream}")


async def test_a_process_that_provisions_provisions_a_missing_stream_again(nc: Client) -> None:
    t = dataclasses.replace(fresh_topology(), partitions=2)
    await ensure_topology(nc, t)
    try:
        await api_request(nc, f"$JS.API.STREAM.DELETE.{t.dlq_stream}")
        restorer = Restorer(nc, t, interval_s=60.0)
        assert await restorer.provision(lambda: ensure_topology(nc, t)) == "restored"
        assert await _exists(nc, f"$JS.API.STREAM.INFO.{t.dlq_stream}")
        assert await restorer.provision(lambda: ensure_topology(nc, t)) == "later"
    finally:
        await drop_topology(nc, t)
