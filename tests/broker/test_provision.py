"""ensure_topology against the real server: streams, transform, consumers, bucket; idempotent."""

from __future__ import annotations

import dataclasses

from nats.aio.client import Client

from tokenwire.broker import Topology, ensure_topology
from tokenwire.broker._api import api_request


async def test_ensure_topology_provisions_everything_and_is_idempotent(
    nc: Client, topology: Topology
) -> None:
    await ensure_topology(nc, topology, ack_wait_s=30.0, priority_timeout_s=2.0)  # second run
    js = nc.jetstream()
    info = await js.stream_info(topology.stream)
    assert info.config.subjects == [f"{topology.prefix}.in.*.*"]
    assert info.config.duplicate_window == 120.0
    assert info.config.storage == "file"
    assert info.config.subject_transform is not None
    assert "partition(4,1)" in info.config.subject_transform.dest
    events = await js.stream_info(topology.events_stream)
    assert events.config.subjects == [f"{topology.prefix}.events.>"]
    dlq = await js.stream_info(topology.dlq_stream)
    assert dlq.config.subjects == [f"{topology.prefix}.dlq.>"]
    await js.key_value(topology.steps_bucket)
    names = sorted(c.name for c in await js.consumers_info(topology.stream))
    assert names == ["assembler-p0", "assembler-p1", "assembler-p2", "assembler-p3", "telemetry"]


async def test_assembler_consumers_are_pinned_client_groups(nc: Client, topology: Topology) -> None:
    reply = await api_request(nc, f"$JS.API.CONSUMER.INFO.{topology.stream}.assembler-p2")
    config = reply["config"]
    assert config["filter_subject"] == f"{topology.prefix}.chunks.2.>"
    assert config["priority_groups"] == ["assemblers"]
    assert config["priority_policy"] == "pinned_client"
    assert config["priority_timeout"] == 2_000_000_000
    assert config["ack_policy"] == "explicit"
    assert config["max_ack_pending"] == 200_000
    telemetry = await api_request(nc, f"$JS.API.CONSUMER.INFO.{topology.stream}.telemetry")
    assert telemetry["config"]["filter_subject"] == f"{topology.prefix}.chunks.*.*.first"


async def test_a_changed_setting_updates_the_stream(nc: Client, topology: Topology) -> None:
    longer = dataclasses.replace(topology, duplicate_window_s=300.0)
    await ensure_topology(nc, longer)
    info = await nc.jetstream().stream_info(topology.stream)
    assert info.config.duplicate_window == 300.0
