"""``ensure_topology``: create or update the streams, KV bucket and consumers (idempotent)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from nats.aio.client import Client
from nats.js.errors import Error as JsError

from tokenwire.broker._api import NS, STREAM_NAME_IN_USE, STREAM_NOT_FOUND, ApiError, api_request
from tokenwire.broker._cooldowns import MARKER_TTL_S as COOLDOWN_MARKER_TTL_S
from tokenwire.broker._cooldowns import MAX_AGE_S as COOLDOWN_MAX_AGE_S
from tokenwire.broker._errors import ReshardRefused, TopologyError
from tokenwire.broker._layout import (
    check_layout,
    check_registry_layout,
    current_layout,
    retire,
    retire_unsharded_events,
    spread_leaders,
    undrained,
)
from tokenwire.broker._topology import Topology

log = logging.getLogger(__name__)

DEFAULT_ACK_WAIT_S = 300.0
DEFAULT_MAX_DELIVER = 10
DEFAULT_PRIORITY_TIMEOUT_S = 5.0
DEFAULT_MEMBER_TTL_S = 6.0
ASSEMBLER_MAX_ACK_PENDING = 200_000


def shard_stream_config(t: Topology, shard: int) -> dict[str, Any]:
    """Shard ``shard``'s chunk stream: its partitions' subjects ``<prefix>.chunks.<p>.*.*``
    (the gateway publishes straight to them), ``max_bytes`` its share of the retention
    budget, the layout's compression and, with ``shard_tags``, its placement tag.

    No subject transform: a K = 1 stream provisioned before shards (``<prefix>.in.*.*`` and a
    ``{{partition(n,1)}}`` transform) is updated in place to this form, keeping its messages.
    """
    config = {
        "name": t.shard_stream(shard),
        "subjects": t.shard_subjects(shard),
        **_limits(t, t.shard_max_bytes),
        "compression": t.compression,
    }
    if t.shard_tags:
        config["placement"] = {"tags": [t.shard_tags[shard % len(t.shard_tags)]]}
    return config


def _limits(t: Topology, max_bytes: int) -> dict[str, Any]:
    return {
        "retention": "limits",
        "storage": "file",
        "discard": "old",
        "max_age": int(t.max_age_s * NS),
        "max_bytes": max_bytes,
        "duplicate_window": int(t.duplicate_window_s * NS),
        "num_replicas": t.replicas,
    }


def side_stream_config(t: Topology, name: str, subjects: str) -> dict[str, Any]:
    """The DLQ stream: same limits, no transform, an eighth of the budget."""
    return {"name": name, "subjects": [subjects], **_limits(t, t.max_bytes // 8)}


def events_stream_config(t: Topology, shard: int) -> dict[str, Any]:
    """Events shard ``shard``'s stream: same limits, the events' eighth of the budget split
    over the R events streams."""
    return {
        "name": t.events_shard_stream(shard),
        "subjects": [t.events_shard_subjects(shard)],
        **_limits(t, t.max_bytes // 8 // t.registry_shards),
    }


def assembler_consumer_config(
    t: Topology, partition: int, ack_wait_s: float, max_deliver: int, priority_timeout_s: float
) -> dict[str, Any]:
    """Durable pull consumer of one partition, pinned to one client of the assembler group."""
    name = t.assembler_consumer(partition)
    return {
        "durable_name": name,
        "name": name,
        "filter_subject": t.partition_filter(partition),
        "deliver_policy": "all",
        "ack_policy": "explicit",
        "ack_wait": int(ack_wait_s * NS),
        "max_deliver": max_deliver,
        "max_ack_pending": ASSEMBLER_MAX_ACK_PENDING,
        "max_waiting": 512,
        "priority_groups": [t.assembler_group],
        "priority_policy": "pinned_client",
        "priority_timeout": int(priority_timeout_s * NS),
    }


def telemetry_consumer_config(t: Topology, ack_wait_s: float, max_deliver: int) -> dict[str, Any]:
    """Durable pull consumer of first chunks only (selection by subject, on the server); one
    per shard stream, each of the same name and filter."""
    return {
        "durable_name": t.telemetry_consumer,
        "name": t.telemetry_consumer,
        "filter_subject": t.first_chunks_filter,
        "deliver_policy": "all",
        "ack_policy": "explicit",
        "ack_wait": int(ack_wait_s * NS),
        "max_deliver": max_deliver,
        "max_ack_pending": 20_000,
    }


STORE_CREATE_FAILED = 10049
"""``error creating store for stream``: nats-server 2.15.1 answers it when a stream is created
while the account's last stream is being deleted (its ``streams`` directory removed under the
create; reproduced: 4 in 700 delete-then-create rounds on an otherwise empty account, none with
another stream alive). Transient: the create is tried again."""
STORE_CREATE_BACKOFF_S = (0.05, 0.2, 0.5)


async def ensure_stream(nc: Client, config: dict[str, Any]) -> None:
    """Create the stream, or update it when it exists with other settings. A create the server
    failed to store (:data:`STORE_CREATE_FAILED`) is tried again, at most
    ``len(STORE_CREATE_BACKOFF_S)`` times; then TopologyError."""
    name = config["name"]
    for delay_s in (*STORE_CREATE_BACKOFF_S, None):
        try:
            await api_request(nc, f"$JS.API.STREAM.CREATE.{name}", config)
            return
        except ApiError as exc:
            if exc.err_code == STREAM_NAME_IN_USE:
                await _update_stream(nc, config)
                return
            if exc.err_code != STORE_CREATE_FAILED or delay_s is None:
                raise TopologyError(f"stream {name}", exc.description) from exc
        await asyncio.sleep(delay_s)


async def _update_stream(nc: Client, config: dict[str, Any]) -> None:
    name = config["name"]
    try:
        await api_request(nc, f"$JS.API.STREAM.UPDATE.{name}", config)
    except ApiError as exc:
        raise TopologyError(f"stream {name}", exc.description) from exc


async def ensure_consumer(nc: Client, stream: str, config: dict[str, Any]) -> None:
    """Create or update a durable consumer with a raw ``$JS.API.CONSUMER.CREATE`` request."""
    name = config["name"]
    body = {"stream_name": stream, "config": config, "action": ""}
    try:
        await api_request(nc, f"$JS.API.CONSUMER.CREATE.{stream}.{name}", body)
    except ApiError as exc:
        raise TopologyError(f"consumer {stream}/{name}", exc.description) from exc


async def ensure_steps_bucket(nc: Client, t: Topology) -> None:
    """The step registry's KV buckets (``t.registry_buckets``); their entries live as long
    as the chunks do."""
    js = nc.jetstream()
    for bucket in t.registry_buckets:
        try:
            await js.create_key_value(
                bucket=bucket, history=1, ttl=t.max_age_s, replicas=t.replicas
            )
        except JsError as exc:
            raise TopologyError(f"bucket {bucket}", str(exc)) from exc


def members_bucket_config(t: Topology, member_ttl_s: float) -> dict[str, Any]:
    """The assemblers' membership bucket: a KV bucket (``KV_<name>``, ``$KV.<name>.<member>``,
    one value per key) whose ``max_age`` is the heartbeat TTL, so the broker removes a member
    that stopped writing.

    File storage, so the bucket survives a broker restart (a memory stream of a single
    server is gone after one, and every heartbeat then fails with "no responders": issue 48);
    the heartbeats stored before an outage longer than the TTL expire by ``max_age`` when the
    server loads them again."""
    bucket = t.members_bucket
    ttl = int(member_ttl_s * NS)
    return {
        "name": f"KV_{bucket}",
        "subjects": [f"$KV.{bucket}.>"],
        "retention": "limits",
        "storage": "file",
        "discard": "new",
        "max_msgs_per_subject": 1,
        "max_age": ttl,
        "duplicate_window": ttl,
        "max_bytes": 8 * 1024 * 1024,
        "allow_direct": True,
        "allow_rollup_hdrs": True,
        "num_replicas": t.replicas,
    }


async def ensure_members_bucket(nc: Client, t: Topology, member_ttl_s: float) -> None:
    """Create or update the membership bucket (:func:`members_bucket_config`). A bucket of
    before issue 48 keeps its heartbeats in memory, and JetStream refuses to change a
    stream's storage type: such a bucket is deleted and created again (it holds nothing but
    heartbeats, which every member writes again within a heartbeat period)."""
    config = members_bucket_config(t, member_ttl_s)
    name = config["name"]
    try:
        info = await api_request(nc, f"$JS.API.STREAM.INFO.{name}")
    except ApiError as exc:
        if exc.err_code != STREAM_NOT_FOUND:
            raise TopologyError(f"stream {name}", exc.description) from exc
    else:
        if (info.get("config") or {}).get("storage") == "memory":
            log.warning("membership bucket %s was in memory: recreated with file storage", name)
            try:
                await api_request(nc, f"$JS.API.STREAM.DELETE.{name}")
            except ApiError as exc:
                raise TopologyError(f"stream {name}", exc.description) from exc
    await ensure_stream(nc, config)


def cooldowns_bucket_config(t: Topology) -> dict[str, Any]:
    """The routed deployments' shared cooldowns (``broker._cooldowns``): a KV bucket whose
    messages carry their own TTL (``allow_msg_ttl``, nats-server 2.11+) and whose expiries
    leave a marker every watcher sees (``subject_delete_marker_ttl``). File storage: a broker
    restart keeps a cooldown. Small: one key per deployment."""
    bucket = t.cooldowns_bucket
    return {
        "name": f"KV_{bucket}",
        "subjects": [f"$KV.{bucket}.>"],
        "retention": "limits",
        "storage": "file",
        "discard": "new",
        "max_msgs_per_subject": 1,
        "max_age": int(COOLDOWN_MAX_AGE_S * NS),
        "max_bytes": 8 * 1024 * 1024,
        "allow_direct": True,
        "allow_rollup_hdrs": True,
        "allow_msg_ttl": True,
        "subject_delete_marker_ttl": int(COOLDOWN_MARKER_TTL_S * NS),
        "duplicate_window": int(60 * NS),
        "num_replicas": t.replicas,
    }


async def ensure_cooldowns_bucket(nc: Client, t: Topology) -> None:
    """Create (or update) the cooldowns bucket: at provisioning, and by a gateway that finds it
    missing (a broker restarted without it)."""
    await ensure_stream(nc, cooldowns_bucket_config(t))


def keys_bucket_config(t: Topology) -> dict[str, Any]:
    """The gateway keys and tenants (``broker._keys``, ADR 0041): a KV bucket of one message
    per entry, kept until replaced or deleted (no age: a key lives until revoked, and a
    revoke's delete marker stays, so a keys file never seeds a revoked name again). File
    storage, ``TOKENWIRE_REPLICAS`` replicas: a broker restart keeps every key."""
    bucket = t.keys_bucket
    return {
        "name": f"KV_{bucket}",
        "subjects": [f"$KV.{bucket}.>"],
        "retention": "limits",
        "storage": "file",
        "discard": "new",
        "max_msgs_per_subject": 1,
        "max_age": 0,
        "max_bytes": 64 * 1024 * 1024,
        "max_msg_size": 64 * 1024,
        "allow_direct": True,
        "allow_rollup_hdrs": True,
        "deny_delete": True,
        "duplicate_window": int(120 * NS),
        "num_replicas": t.replicas,
    }


async def ensure_keys_bucket(nc: Client, t: Topology) -> None:
    """Create (or update) the keys bucket: at provisioning."""
    await ensure_stream(nc, keys_bucket_config(t))


def limits_bucket_config(t: Topology) -> dict[str, Any]:
    """The keys' and tenants' shared allowances (``broker._allowances``, ADR 0042): a KV
    bucket whose messages carry their own TTL (a minute's counter leaves with its window).
    File storage and the topology's replicas: a broker restart keeps every lease and every
    spend."""
    bucket = t.limits_bucket
    return {
        "name": f"KV_{bucket}",
        "subjects": [f"$KV.{bucket}.>"],
        "retention": "limits",
        "storage": "file",
        "discard": "new",
        "max_msgs_per_subject": 1,
        "max_bytes": 64 * 1024 * 1024,
        "allow_direct": True,
        "allow_rollup_hdrs": True,
        "allow_msg_ttl": True,
        "duplicate_window": int(60 * NS),
        "num_replicas": t.replicas,
    }


async def ensure_limits_bucket(nc: Client, t: Topology) -> None:
    """Create (or update) the allowances bucket: at provisioning, and by a gateway that finds
    it missing."""
    await ensure_stream(nc, limits_bucket_config(t))


async def ensure_topology(
    nc: Client,
    topology: Topology,
    *,
    ack_wait_s: float = DEFAULT_ACK_WAIT_S,
    max_deliver: int = DEFAULT_MAX_DELIVER,
    priority_timeout_s: float = DEFAULT_PRIORITY_TIMEOUT_S,
    telemetry_ack_wait_s: float | None = None,
    member_ttl_s: float = DEFAULT_MEMBER_TTL_S,
) -> None:
    """Create or update everything tokenwire needs on the broker; safe to call from every process.

    The telemetry consumer's ``ack_wait`` defaults to :func:`telemetry_ack_wait` (inside the
    events stream's duplicate window, so a signal redelivered after a crash normally still
    falls in its window; the consumer also checks redeliveries against the stored events).

    Every shard's stream, its assembler consumers (``assembler-p<i>`` on the stream of
    partition i) and a ``telemetry`` consumer per shard stream; the R registry buckets and
    events streams; the assemblers' membership, the deployments' cooldowns, the keys and the
    limits buckets;
    then, in a cluster, the shard leaders, the registry buckets' and the events streams'
    leaders are spread over the nodes (:func:`spread_leaders`, bounded).

    Raises LayoutConflict, before changing anything, when the broker holds chunk streams of
    another layout (RegistryLayoutConflict: step-registry buckets of another R);
    TopologyError when the server refuses a setting (e.g. switching an existing consumer's
    priority policy, which JetStream does not allow).
    """
    t = topology
    await check_layout(nc, t)
    await check_registry_layout(nc, t)
    for shard in range(t.shards):
        await ensure_stream(nc, shard_stream_config(t, shard))
    await retire_unsharded_events(nc, t)
    for shard in range(t.registry_shards):
        await ensure_stream(nc, events_stream_config(t, shard))
    await ensure_stream(nc, side_stream_config(t, t.dlq_stream, f"{t.prefix}.dlq.>"))
    await ensure_steps_bucket(nc, t)
    await ensure_members_bucket(nc, t, member_ttl_s)
    await ensure_cooldowns_bucket(nc, t)
    await ensure_keys_bucket(nc, t)
    await ensure_limits_bucket(nc, t)
    for p in range(t.partitions):
        config = assembler_consumer_config(t, p, ack_wait_s, max_deliver, priority_timeout_s)
        await ensure_consumer(nc, t.stream_of_partition(p), config)
    telemetry_wait = telemetry_ack_wait_s or telemetry_ack_wait(t, ack_wait_s)
    telemetry = telemetry_consumer_config(t, telemetry_wait, max_deliver)
    for stream in t.chunk_streams:
        await ensure_consumer(nc, stream, telemetry)
    await spread_leaders(nc, t)


def telemetry_ack_wait(t: Topology, ack_wait_s: float = DEFAULT_ACK_WAIT_S) -> float:
    """``ack_wait_s``, but at most half the duplicate window (60 s by default): a redelivery
    after a crash between publish and ack then comes while the window still holds the id."""
    return min(ack_wait_s, t.duplicate_window_s / 2)


async def reshard(
    nc: Client, topology: Topology, **provision: Any
) -> tuple[Topology | None, list[str]]:
    """Switch the broker to ``topology``'s shard layout; returns the layout found before (None
    when there was none) and the streams retired.

    When the streams capturing chunk subjects are another layout, every durable consumer of
    that layout must be drained (nothing pending, nothing unacknowledged: stop the gateways
    and let the assemblers and the telemetry consumer finish), else ReshardRefused and
    nothing changes. Its streams are then retired (:func:`retire`: their subjects moved to
    ``<prefix>.retired...``, their data readable until it ages out) and the new layout is
    provisioned (``ensure_topology`` with ``provision``'s settings). The same layout, or a
    K = 1 layout with other partitions (the same stream, updated in place: docs/operations.md,
    "Adding partitions"), is only provisioned. Idempotent: a second run finds the new layout.
    """
    old = await current_layout(nc, topology)
    retired: list[str] = []
    if old is not None and old.layout != topology.layout:
        busy = await undrained(nc, old)
        if busy:
            shown = "; ".join(busy[:4]) + (f"; ... {len(busy) - 4} more" if len(busy) > 4 else "")
            raise ReshardRefused(
                f"the current layout {old.layout} is not drained ({shown}): stop the gateways"
                " and let the assemblers and the telemetry consumer finish first"
            )
        if not set(old.chunk_streams) & set(topology.chunk_streams):
            retired = await retire(nc, old)
    await ensure_topology(nc, topology, **provision)
    return old, retired
