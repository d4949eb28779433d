"""The shard layout the broker holds: which streams capture chunk subjects, whether they are
this process's layout, where their leaders are, and which retired layouts still hold data.

A chunk stream belongs to exactly one layout (``K`` shards over ``P`` partitions; the name
encodes it, see :class:`~tokenwire.broker.Topology`). Two layouts cannot capture the same
subjects at once (JetStream refuses overlapping streams), and a process of one layout must
never write or read where the other files chunks; so every service and provisioning first
checks that the streams capturing ``<prefix>.chunks.>`` (and the pre-shard input subjects
``<prefix>.in.>``) are all streams of its own layout (:func:`check_layout`).

``tokenwire reshard`` retires a layout: its streams keep their data but capture only
``<prefix>.retired.K<k>.P<p>.<name>``, a subject nobody publishes to, so the data stays
readable until it ages out (:func:`locate_session` finds a session there).

The step registry's buckets have a layout of their own, R (``registry_shards``), which never
changes on a deployment: :func:`check_registry_layout` refuses buckets of another R.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from nats.aio.client import Client

from tokenwire.broker._api import ApiError, api_request
from tokenwire.broker._errors import (
    LayoutConflict,
    RegistryLayoutConflict,
    ReshardRefused,
    TopologyError,
)
from tokenwire.broker._topology import Topology

_PAGE_BOUND = 100
"""Pages of stream names read at most (1,024 names each); a bound, never reached in practice."""
LEADER_WAIT_S = 10.0
"""How long provisioning waits for a shard stream to have a leader, and for one stepdown."""
_POLL_S = 0.1
_RETIRED = re.compile(r"^retired\.K(?P<k>\d+)\.P(?P<p>\d+)\.(?P<name>[^.]+)$")


async def streams_capturing(nc: Client, subject: str) -> list[str]:
    """The names of the streams whose subjects overlap ``subject`` (``$JS.API.STREAM.NAMES``
    with a subject filter, every page)."""
    names: list[str] = []
    for _ in range(_PAGE_BOUND):
        try:
            page = await api_request(
                nc, "$JS.API.STREAM.NAMES", {"subject": subject, "offset": len(names)}
            )
        except ApiError as exc:
            raise TopologyError(f"the stream names capturing {subject}", exc.description) from exc
        got = page.get("streams") or []
        names += got
        if not got or len(names) >= int(page.get("total", 0)):
            break
    return sorted(set(names))


async def chunk_streams_found(nc: Client, t: Topology) -> list[str]:
    """The streams capturing this prefix's chunk subjects, or its pre-shard input subjects."""
    found = await streams_capturing(nc, t.chunks_wildcard)
    found += await streams_capturing(nc, f"{t.prefix}.in.>")
    return sorted(set(found))


async def check_layout(nc: Client, t: Topology) -> None:
    """Raise :class:`LayoutConflict` when a stream of another layout captures chunk subjects.

    Streams of this layout (all of them, some, or none yet) pass; so does this layout's K = 1
    stream still in the pre-shard form (``<prefix>.in.*.*`` and a transform), which
    provisioning updates in place.
    """
    found = await chunk_streams_found(nc, t)
    if set(found) - set(t.chunk_streams):
        raise LayoutConflict(describe(t), describe_found(t, found))


async def check_registry_layout(nc: Client, t: Topology) -> None:
    """Raise :class:`RegistryLayoutConflict` when the broker holds step-registry buckets of
    another R than ``t.registry_shards`` (this layout's buckets, some or none yet, pass)."""
    found = await registry_buckets_found(nc, t)
    if set(found) - set(t.registry_buckets):
        layouts = ",".join(str(r) for r in sorted({_registry_shards(t, b) or 0 for b in found}))
        raise RegistryLayoutConflict(
            f"R={t.registry_shards} ({', '.join(t.registry_buckets)})",
            f"R={layouts}: {', '.join(found)}",
        )


async def registry_buckets_found(nc: Client, t: Topology) -> list[str]:
    """The step-registry buckets on the broker, of any R: ``<steps_bucket>`` and
    ``<steps_bucket>-r<R>-<i>`` (their streams capture ``$KV.<bucket>.>``)."""
    names = await streams_capturing(nc, "$KV.>")
    buckets = [name.removeprefix("KV_") for name in names if name.startswith("KV_")]
    return sorted(b for b in buckets if _registry_shards(t, b) is not None)


def _registry_shards(t: Topology, bucket: str) -> int | None:
    """The R a registry bucket's name encodes, None when it is not one of ``t``'s."""
    if bucket == t.steps_bucket:
        return 1
    match = _REGISTRY_NAME.match(bucket)
    if match is None or match["base"] != t.steps_bucket:
        return None
    return int(match["r"])


def describe(t: Topology) -> str:
    """``K=4 P=16 (<stream>_K4_P16_S0 .. <stream>_K4_P16_S3)``."""
    streams = t.chunk_streams
    names = streams[0] if len(streams) == 1 else f"{streams[0]} .. {streams[-1]}"
    return f"{t.layout} ({names})"


def describe_found(t: Topology, names: list[str]) -> str:
    """``K=1: <stream>`` / ``K=4 P=16: <stream>_K4_P16_S0, ...``: each name with the layout
    its name encodes (a K = 1 name does not encode its partitions)."""
    parts = []
    for name in names:
        match = _SHARD_NAME.match(name)
        if name == t.stream:
            parts.append(f"K=1: {name}")
        elif match is not None and match["base"] == t.stream:
            parts.append(f"K={match['k']} P={match['p']}: {name}")
        else:
            parts.append(name)
    return ", ".join(parts)


def retired_subject(t: Topology, stream: str) -> str:
    """What a retired stream of layout ``t`` captures: ``<prefix>.retired.K<k>.P<p>.<stream>``
    (never published to; the subject records the layout the stream's data was filed by)."""
    return f"{t.prefix}.retired.K{t.shards}.P{t.partitions}.{stream}"


async def retired_layouts(nc: Client, t: Topology) -> list[Topology]:
    """The retired layouts whose streams still exist, newest first (``STREAM.LIST`` of the
    streams capturing ``<prefix>.retired.>``; their layout read from that subject)."""
    created: dict[tuple[int, int], str] = {}
    for info in await _stream_list(nc, f"{t.prefix}.retired.>"):
        config = info.get("config") or {}
        for subject in config.get("subjects") or []:
            match = _RETIRED.match(subject.removeprefix(f"{t.prefix}."))
            if match is not None:
                key = (int(match["k"]), int(match["p"]))
                created[key] = max(created.get(key, ""), str(info.get("created", "")))
    newest = sorted(created, key=lambda key: created[key], reverse=True)
    return [dataclasses.replace(t, shards=k, partitions=p) for k, p in newest]


async def _stream_list(nc: Client, subject: str) -> list[dict[str, Any]]:
    infos: list[dict[str, Any]] = []
    for _ in range(_PAGE_BOUND):
        try:
            page = await api_request(
                nc, "$JS.API.STREAM.LIST", {"subject": subject, "offset": len(infos)}
            )
        except ApiError as exc:
            raise TopologyError(f"the streams capturing {subject}", exc.description) from exc
        got = page.get("streams") or []
        infos += got
        if not got or len(infos) >= int(page.get("total", 0)):
            break
    return infos


async def holds_session(nc: Client, t: Topology, session: str) -> bool:
    """Does ``t``'s stream of ``session`` hold at least one of its chunks (as its leader
    counts; False when the stream does not exist)."""
    body = {"subjects_filter": t.session_filter(session)}
    try:
        info = await api_request(nc, f"$JS.API.STREAM.INFO.{t.stream_of(session)}", body)
    except ApiError as exc:
        if exc.code == 404:
            return False
        raise TopologyError(f"stream {t.stream_of(session)}", exc.description) from exc
    return bool((info.get("state") or {}).get("subjects"))


async def locate_session(nc: Client, t: Topology, session: str) -> Topology:
    """The layout to read ``session`` with: ``t`` when its stream holds the session (or when
    no retired layout does), else the newest retired layout whose stream holds it.

    After ``tokenwire reshard`` old sessions stay in the retired streams until they age out;
    new sessions (and new steps of every session) go to the new layout.
    """
    if await holds_session(nc, t, session):
        return t
    for layout in await retired_layouts(nc, t):
        if await holds_session(nc, layout, session):
            return layout
    return t


# -- leaders ---------------------------------------------------------------------------------


async def stream_cluster(nc: Client, stream: str) -> dict[str, Any]:
    """The stream's ``cluster`` block (``leader``, ``replicas``); empty on a single server."""
    try:
        info = await api_request(nc, f"$JS.API.STREAM.INFO.{stream}")
    except ApiError as exc:
        raise TopologyError(f"stream {stream}", exc.description) from exc
    cluster: dict[str, Any] = info.get("cluster") or {}
    return cluster


async def _leader_now(nc: Client, stream: str) -> str:
    """The stream's leader now; "" while it has none (or does not answer: an election)."""
    try:
        return str((await stream_cluster(nc, stream)).get("leader") or "")
    except TopologyError:
        return ""


async def shard_leaders(nc: Client, t: Topology, wait_s: float = LEADER_WAIT_S) -> dict[str, str]:
    """Chunk stream -> the node leading it (:func:`leaders_of` the shard streams)."""
    return await leaders_of(nc, t.chunk_streams, wait_s)


async def leaders_of(
    nc: Client, streams: Sequence[str], wait_s: float = LEADER_WAIT_S
) -> dict[str, str]:
    """Stream -> the node leading it, waiting up to ``wait_s`` for each to have a leader
    (right after a create the raft group is still electing); "" for one that has none."""
    leaders: dict[str, str] = {}
    for stream in streams:
        deadline = time.monotonic() + wait_s
        leader = ""
        while True:
            leader = await _leader_now(nc, stream)
            if leader or time.monotonic() >= deadline:
                break
            await asyncio.sleep(_POLL_S)
        leaders[stream] = leader
    return leaders


async def spread_leaders(nc: Client, t: Topology, wait_s: float = LEADER_WAIT_S) -> dict[str, str]:
    """Move shard leaders so that no node leads more than ``ceil(K / nodes)`` of them, by
    ``$JS.API.STREAM.LEADER.STEPDOWN.<stream>`` with a preferred peer (nats-server 2.11+);
    then the same for the step registry's R buckets and for the R events streams, each a
    group of its own.

    Idempotent (a balanced layout makes no request) and bounded: at most one stepdown per
    stream, each waited for at most ``wait_s``; a stepdown the server refuses or that lands
    elsewhere is left as it is (JetStream still works, only less spread). Returns stream ->
    leader as they are now, for the groups of more than one stream ({} with replicas 1).
    A replica-1 stream cannot move its leader (its data lives on one
    node): there placement tags are the only lever.
    """
    if t.replicas < 2:
        return {}
    registry = [f"KV_{bucket}" for bucket in t.registry_buckets]
    leaders: dict[str, str] = {}
    for group in (t.chunk_streams, registry, t.events_streams):
        if len(group) > 1:
            leaders |= await _spread(nc, group, wait_s)
    return leaders


async def _spread(nc: Client, streams: Sequence[str], wait_s: float) -> dict[str, str]:
    """:func:`spread_leaders` for one group of streams."""
    leaders = await leaders_of(nc, streams, wait_s)
    peers = {s: await _current_peers(nc, s) for s in streams}
    nodes = {n for names in peers.values() for n in names}
    if len(nodes) < 2:
        return leaders
    cap = math.ceil(len(streams) / len(nodes))
    load = Counter(leaders.values())
    for stream in streams:
        leader = leaders[stream]
        if not leader or load[leader] <= cap:
            continue
        targets = [n for n in peers[stream] if n != leader and load[n] < cap]
        if not targets:
            continue
        target = min(targets, key=lambda n: (load[n], n))
        moved = await _step_down(nc, stream, leader, target, wait_s)
        if moved:
            load[leader] -= 1
            load[moved] += 1
            leaders[stream] = moved
    return leaders


async def _current_peers(nc: Client, stream: str) -> list[str]:
    """The leader and the replicas that are current: the nodes that may lead now."""
    cluster = await stream_cluster(nc, stream)
    names = [str(cluster.get("leader") or "")]
    names += [str(r.get("name")) for r in cluster.get("replicas") or [] if r.get("current")]
    return [n for n in names if n]


async def _step_down(nc: Client, stream: str, old: str, preferred: str, wait_s: float) -> str:
    """Ask ``stream``'s leader ``old`` to hand over to ``preferred``; the new leader ("" if
    none within ``wait_s`` or the server refused)."""
    body = {"placement": {"preferred": preferred}}
    try:
        await api_request(nc, f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", body)
    except ApiError:
        return ""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        leader = await _leader_now(nc, stream)
        if leader and leader != old:
            return leader
        await asyncio.sleep(_POLL_S)
    return ""


# -- changing the layout ---------------------------------------------------------------------

_SHARD_NAME = re.compile(r"^(?P<base>.+)_K(?P<k>\d+)_P(?P<p>\d+)_S(?P<s>\d+)$")
_REGISTRY_NAME = re.compile(r"^(?P<base>.+)-r(?P<r>\d+)-(?P<i>\d+)$")
_RETIRED_SLACK = 1024 * 1024
"""Bytes a retired stream's ``max_bytes`` keeps above what it holds (never discards any)."""
_TRANSFORM_N = re.compile(r"partition\((?P<n>\d+),")


async def current_layout(nc: Client, t: Topology) -> Topology | None:
    """The layout of the streams capturing chunk subjects now (None: there are none).

    K > 1 names encode it; a K = 1 stream's partitions are read from its subjects (or, in the
    pre-shard form, from its transform's ``{{partition(n,1)}}``). ReshardRefused when the
    streams found are not (part of) one layout with ``t``'s names."""
    found = await chunk_streams_found(nc, t)
    if not found:
        return None
    layouts = {await _layout_of(nc, t, name) for name in found}
    if len(layouts) != 1 or None in layouts:
        raise ReshardRefused(f"the chunk streams {', '.join(found)} are not one layout")
    ((shards, partitions),) = layouts  # type: ignore[misc]  # None excluded above
    layout = dataclasses.replace(t, shards=shards, partitions=partitions)
    if not set(found) <= set(layout.chunk_streams):
        raise ReshardRefused(f"the chunk streams {', '.join(found)} are not one layout")
    return layout


async def _layout_of(nc: Client, t: Topology, name: str) -> tuple[int, int] | None:
    match = _SHARD_NAME.match(name)
    if match is not None:
        return (int(match["k"]), int(match["p"])) if match["base"] == t.stream else None
    if name != t.stream:
        return None
    try:
        config = (await api_request(nc, f"$JS.API.STREAM.INFO.{name}"))["config"]
    except ApiError as exc:
        raise TopologyError(f"stream {name}", exc.description) from exc
    dest = (config.get("subject_transform") or {}).get("dest", "")
    legacy = _TRANSFORM_N.search(dest)
    if legacy is not None:
        return 1, int(legacy["n"])
    return 1, len(config.get("subjects") or [])


async def undrained(nc: Client, t: Topology) -> list[str]:
    """The durable consumers of layout ``t`` with undelivered or unacknowledged chunks, each
    as ``stream/consumer: N pending, M ack pending`` (empty: drained)."""
    busy: list[str] = []
    durables = [(t.stream_of_partition(p), t.assembler_consumer(p)) for p in range(t.partitions)]
    durables += [(s, t.telemetry_consumer) for s in t.chunk_streams]
    for stream, consumer in durables:
        try:
            info = await api_request(nc, f"$JS.API.CONSUMER.INFO.{stream}.{consumer}")
        except ApiError as exc:
            if exc.code == 404:
                continue  # never created (an old layout without this consumer)
            raise TopologyError(f"consumer {stream}/{consumer}", exc.description) from exc
        pending, acks = int(info.get("num_pending", 0)), int(info.get("num_ack_pending", 0))
        if pending or acks:
            busy.append(f"{stream}/{consumer}: {pending} pending, {acks} ack pending")
    return busy


async def retire(nc: Client, old: Topology) -> list[str]:
    """Move every stream of layout ``old`` off the chunk subjects (to its retired subject),
    keeping its messages: they stay readable until they age out (``max_age``). Returns the
    streams retired (the ones that still captured chunk subjects)."""
    return [
        name
        for name in old.chunk_streams
        if await _retire_stream(nc, name, retired_subject(old, name))
    ]


async def retire_unsharded_events(nc: Client, t: Topology) -> bool:
    """With R > 1, the one events stream of a broker provisioned before the events followed R
    (``events_stream`` capturing ``<prefix>.events.>``, which overlaps the R streams'
    subjects) moves to ``<prefix>.retired.events.<name>``: its events stay readable until
    they age out. True when it was moved now."""
    if t.registry_shards == 1:
        return False
    subject = f"{t.prefix}.retired.events.{t.events_stream}"
    return await _retire_stream(nc, t.events_stream, subject)


async def _retire_stream(nc: Client, name: str, subject: str) -> bool:
    """Move stream ``name`` to capture only ``subject`` (nobody publishes there). Its
    ``max_bytes`` shrinks to what it holds (nothing new comes in), which releases the rest of
    its reservation on the servers' file store. False when it does not exist or already
    captures only ``subject``."""
    try:
        info = await api_request(nc, f"$JS.API.STREAM.INFO.{name}")
    except ApiError as exc:
        if exc.code == 404:
            return False
        raise TopologyError(f"stream {name}", exc.description) from exc
    config = dict(info["config"])
    if config.get("subjects") == [subject]:
        return False
    config["subjects"] = [subject]
    config.pop("subject_transform", None)
    config["max_bytes"] = int((info.get("state") or {}).get("bytes", 0)) + _RETIRED_SLACK
    try:
        await api_request(nc, f"$JS.API.STREAM.UPDATE.{name}", config)
    except ApiError as exc:
        raise TopologyError(f"stream {name}", exc.description) from exc
    return True
