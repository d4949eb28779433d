"""ensure_topology against the real server: shard streams, consumers, bucket; idempotent; the
pre-shard stream updated in place without loss; another layout refused."""

from __future__ import annotations

import dataclasses

import pytest
from nats.aio.client import Client

from tests.fixtures.broker import drop_topology, fresh_topology
from tokenwire.broker import (
    ChunkPublisher,
    LayoutConflict,
    Topology,
    check_layout,
    chunk_subject,
    ensure_topology,
    session_batches,
)
from tokenwire.broker._api import api_request
from tokenwire.broker._provision import shard_stream_config


async def test_ensure_topology_provisions_everything_and_is_idempotent(
    nc: Client, topology: Topology
) -> None:
    await ensure_topology(nc, topology, ack_wait_s=30.0, priority_timeout_s=2.0)  # second run
    js = nc.jetstream()
    info = await js.stream_info(topology.stream)
    assert info.config.subjects == [f"{topology.prefix}.chunks.{p}.*.*" for p in range(4)]
    assert info.config.subject_transform is None  # the gateway publishes to them directly
    assert info.config.duplicate_window == 120.0
    assert info.config.storage == "file"
    assert info.config.max_bytes == topology.max_bytes
    raw = await api_request(nc, f"$JS.API.STREAM.INFO.{topology.stream}")
    assert raw["config"]["compression"] == "s2"
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
    longer = dataclasses.replace(topology, duplicate_window_s=300.0, compression="none")
    await ensure_topology(nc, longer)
    info = await nc.jetstream().stream_info(topology.stream)
    assert info.config.duplicate_window == 300.0
    raw = await api_request(nc, f"$JS.API.STREAM.INFO.{topology.stream}")
    assert raw["config"].get("compression", "none") == "none"


async def test_each_shard_is_a_stream_of_its_partitions_with_its_consumers(nc: Client) -> None:
    t = dataclasses.replace(fresh_topology(partitions=6, shards=3), max_bytes=3 * 2**20)
    await ensure_topology(nc, t)
    js = nc.jetstream()
    try:
        assert t.chunk_streams == tuple(f"{t.stream}_K3_P6_S{k}" for k in range(3))
        for k, stream in enumerate(t.chunk_streams):
            info = await js.stream_info(stream)
            owned = (2 * k, 2 * k + 1)  # [k*6//3, (k+1)*6//3)
            assert info.config.subjects == [f"{t.prefix}.chunks.{p}.*.*" for p in owned]
            assert info.config.max_bytes == 2**20  # the budget split over the shards
            names = sorted(c.name for c in await js.consumers_info(stream))
            assert names == [f"assembler-p{p}" for p in owned] + ["telemetry"]
        # A published chunk lands on its session's shard, and only there.
        publisher = await ChunkPublisher(nc, t).start()
        sessions = [f"s-{i}" for i in range(40)]
        for s in sessions:
            await publisher.publish(b"{}", s, 0, 0, 0, first=True)
        await publisher.flush(10.0)
        await publisher.close()
        for stream in t.chunk_streams:
            held = (await js.stream_info(stream, subjects_filter=">")).state.subjects or {}
            assert {subject.split(".")[3] for subject in held} == {
                s for s in sessions if t.stream_of(s) == stream
            }
    finally:
        await drop_topology(nc, t)


def _legacy_config(t: Topology) -> dict[str, object]:
    """The K = 1 chunk stream as provisioning created it before shards: the gateway published
    to ``<prefix>.in.<session>.<kind>`` and the stream's transform computed the partition."""
    src = f"{t.prefix}.in.*.*"
    dest = (
        f"{t.prefix}.chunks.{{{{partition({t.partitions},1)}}}}.{{{{wildcard(1)}}}}"
        ".{{wildcard(2)}}"
    )
    return {
        "name": t.stream,
        "subjects": [src],
        "subject_transform": {"src": src, "dest": dest},
        "storage": "file",
        "retention": "limits",
        "max_bytes": t.max_bytes,
    }


async def test_the_pre_shard_stream_is_updated_in_place_without_loss(nc: Client) -> None:
    t = fresh_topology(partitions=4)
    await api_request(nc, f"$JS.API.STREAM.CREATE.{t.stream}", _legacy_config(t))
    js = nc.jetstream()
    try:
        for i in range(5):  # stored before the update, through the old transform
            await js.publish(f"{t.prefix}.in.old-session.{'first' if i == 0 else 'next'}", b"o")
        await ensure_topology(nc, t)
        info = await js.stream_info(t.stream)
        assert info.config.subject_transform is None
        assert info.config.subjects == [f"{t.prefix}.chunks.{p}.*.*" for p in range(4)]
        await js.publish(chunk_subject(t, "old-session", first=False), b"n")  # after it
        read = [
            payload async for batch in session_batches(nc, t, "old-session") for _, payload in batch
        ]
        assert read == [b"o"] * 5 + [b"n"]
    finally:
        await drop_topology(nc, t)


async def test_another_layout_is_refused_before_anything_changes(nc: Client) -> None:
    four = fresh_topology(partitions=4, shards=2)
    await ensure_topology(nc, four)
    try:
        for other in (dataclasses.replace(four, shards=1), dataclasses.replace(four, shards=4)):
            with pytest.raises(LayoutConflict) as refused:
                await ensure_topology(nc, other)
            message = str(refused.value)
            for named in (other.layout, *four.chunk_streams, "tokenwire reshard", "operations.md"):
                assert named in message
            await check_layout(nc, four)  # the broker's own layout still passes
        names = (await api_request(nc, "$JS.API.STREAM.NAMES", {"subject": ">"}))["streams"]
        assert f"{four.stream}" not in names  # no K=1 stream was created
        assert f"{four.stream}_K4_P4_S0" not in names
    finally:
        await drop_topology(nc, four)


async def test_a_pre_shard_stream_is_another_layout_for_k_above_one(nc: Client) -> None:
    t = fresh_topology(partitions=4)
    await api_request(nc, f"$JS.API.STREAM.CREATE.{t.stream}", _legacy_config(t))
    try:
        with pytest.raises(LayoutConflict, match=t.stream):
            await ensure_topology(nc, dataclasses.replace(t, shards=2))
    finally:
        await drop_topology(nc, t)


def test_placement_tags_go_round_the_shards() -> None:
    t = Topology(partitions=16, shards=4, shard_tags=("az-a", "az-b", "az-c"))
    tags = [shard_stream_config(t, k)["placement"] for k in range(4)]
    assert tags == [{"tags": ["az-a"]}, {"tags": ["az-b"]}, {"tags": ["az-c"]}, {"tags": ["az-a"]}]
    assert "placement" not in shard_stream_config(Topology(shards=2), 0)  # JetStream decides
