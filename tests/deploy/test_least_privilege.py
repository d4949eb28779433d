"""Least privilege, tested as denials: for every service user and the operator, each JetStream
API and subject outside its role is refused by a real nats-server loaded with the committed
deploy/nats/accounts.conf.

The catalogue below is the oracle, written from the roles (docs/operations.md, "Credentials"),
not from the config file: each entry says which users may do it; every other user must get a
permissions violation. The durable consumers' settings are read back at the end, so an update
that slipped through would fail the test even without a violation message.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy._nats import Connection, Node, NodePorts, close, connect_as, provision, running
from tests.deploy.test_nats_config import _single_node_config
from tokenwire.broker import Topology, free_port
from tokenwire.broker._provision import (
    DEFAULT_ACK_WAIT_S,
    DEFAULT_MAX_DELIVER,
    DEFAULT_PRIORITY_TIMEOUT_S,
    assembler_consumer_config,
    telemetry_consumer_config,
)

USERS = ("gateway", "assembler", "telemetry", "operator")
T = Topology()
SHARD = Topology(shards=3).stream_of_partition(15)
"""A shard stream's name (TOKENWIRE_K3_P16_S2): the same rules hold for every layout."""
STREAMS = (T.stream, SHARD, T.events_stream, T.dlq_stream, f"KV_{T.steps_bucket}")
DURABLES = [T.assembler_consumer(p) for p in (0, 7, 15)] + [T.telemetry_consumer]
VIOLATION_BOUND_S = 15.0


@dataclass(frozen=True)
class Pub:
    """A publish (request) to ``subject`` that only ``allowed`` may make."""

    subject: str
    allowed: frozenset[str] = frozenset()
    body: bytes = b"{}"


@dataclass(frozen=True)
class Sub:
    """A subscription to ``subject`` that only ``allowed`` may make."""

    subject: str
    allowed: frozenset[str] = frozenset()


def _users(*names: str) -> frozenset[str]:
    return frozenset(names)


def _durable_update(durable: str) -> Pub:
    """A real create-or-update of a durable (max_deliver lowered), in the named form."""
    if durable == T.telemetry_consumer:
        config = telemetry_consumer_config(T, DEFAULT_ACK_WAIT_S, 1)
    else:
        partition = int(durable.removeprefix("assembler-p"))
        config = assembler_consumer_config(
            T, partition, DEFAULT_ACK_WAIT_S, 1, DEFAULT_PRIORITY_TIMEOUT_S
        )
    body = json.dumps({"stream_name": T.stream, "config": config, "action": "update"})
    subject = f"$JS.API.CONSUMER.CREATE.{T.stream}.{durable}.{config['filter_subject']}"
    return Pub(subject, body=body.encode())


def _unnamed_update(durable: str) -> Pub:
    """The same update in the unnamed form (the name in the body, where no permission sees)."""
    config = telemetry_consumer_config(T, DEFAULT_ACK_WAIT_S, 1) | {"name": durable}
    config.pop("durable_name")
    body = json.dumps({"stream_name": T.stream, "config": config, "action": "update"})
    return Pub(f"$JS.API.CONSUMER.CREATE.{T.stream}", body=body.encode())


def catalogue() -> list[Pub | Sub]:
    """Every API and subject outside some role (see the module docstring)."""
    entries: list[Pub | Sub] = []
    for stream in STREAMS:
        for verb in (
            "CREATE",
            "UPDATE",
            "DELETE",
            "PURGE",
            "MSG.DELETE",
            "SNAPSHOT",
            "RESTORE",
            "LEADER.STEPDOWN",
        ):
            entries.append(Pub(f"$JS.API.STREAM.{verb}.{stream}"))
        entries.append(Pub(f"$JS.API.CONSUMER.CREATE.{stream}"))
        entries.append(Pub(f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.x"))
    for durable in DURABLES:
        entries.append(_durable_update(durable))
        entries.append(_unnamed_update(durable))
        entries.append(Pub(f"$JS.API.CONSUMER.DURABLE.CREATE.{T.stream}.{durable}"))
        entries.append(Pub(f"$JS.API.CONSUMER.DELETE.{T.stream}.{durable}"))
        entries.append(Pub(f"$JS.API.CONSUMER.LEADER.STEPDOWN.{T.stream}.{durable}"))
        entries.append(Pub(f"$JS.API.CONSUMER.PAUSE.{T.stream}.{durable}"))
        mine = _users("assembler") if durable.startswith("assembler") else _users("telemetry")
        entries.append(Pub(f"$JS.API.CONSUMER.MSG.NEXT.{T.stream}.{durable}", mine))
        entries.append(Pub(f"$JS.ACK.{T.stream}.{durable}.1.1.1.1.1", mine))
        if durable.startswith("assembler"):
            entries.append(Pub(f"$JS.API.CONSUMER.UNPIN.{T.stream}.{durable}", mine))
        resetter = mine if durable.startswith("assembler") else _users()
        entries.append(Pub(f"$JS.API.CONSUMER.RESET.{T.stream}.{durable}", resetter))
        entries.append(Pub(f"$JS.API.CONSUMER.DELETE.{SHARD}.{durable}"))
        entries.append(Pub(f"$JS.API.CONSUMER.MSG.NEXT.{SHARD}.{durable}", mine))
    readers = _users("gateway", "operator")
    chunk_readers = readers | {"assembler"}
    entries += [
        Pub("$JS.API.ACCOUNT.PURGE.TOKENWIRE"),
        Pub("$JS.API.META.LEADER.STEPDOWN"),
        Pub("$JS.API.SERVER.REMOVE"),
        # data in: only the gateway files chunks and claims steps
        Pub("tw.chunks.3.sess-x.first", _users("gateway")),
        Pub("tw.chunks.3.sess-x.next", _users("gateway")),
        Pub("tw.in.sess-x.first"),  # the pre-shard input subject: nobody any more
        Pub(f"$KV.{T.steps_bucket}.sess-x", _users("gateway")),
        # events: persisted by the assembler, started by telemetry
        Pub("tw.events.0.sess-x.persisted", _users("assembler")),
        Pub("tw.events.2.sess-x.started", _users("telemetry")),
        Pub("tw.events.sess-x.persisted"),  # the subject before the shard token: nobody
        Pub("tw.events.sess-x.started"),
        Pub("tw.telemetry.started", _users("telemetry")),
        Pub("tw.dlq.assembler", _users("assembler")),
        Pub("tw.dlq.telemetry", _users("telemetry")),
        # reading chunks: replays (gateway, operator) and the take-over read (assembler);
        # the telemetry user sees first chunks through its durable consumer only
        Pub(f"$JS.API.CONSUMER.CREATE.{T.stream}.rdx.tw.chunks.3.sess-x.*", chunk_readers),
        Pub(f"$JS.API.CONSUMER.CREATE.{SHARD}.rdx.tw.chunks.15.sess-x.*", chunk_readers),
        Pub(
            f"$JS.API.CONSUMER.CREATE.{T.events_stream}.rdx.tw.chunks.3.sess-x.*", chunk_readers
        ),  # a filter no events message matches: harmless, and still a read
        Pub(f"$JS.API.CONSUMER.CREATE.{T.events_stream}.rdx.tw.events.>", _users("operator")),
        Pub(
            f"$JS.API.CONSUMER.CREATE.{T.stream}.rdx.tw.chunks.3.>",
            chunk_readers - readers | {"operator"},
        ),
        Pub(f"$JS.API.DIRECT.GET.{T.stream}", _users("operator")),
        # a session's owner (tenant keys) and a resumed step's first chunk, by subject
        Pub(f"$JS.API.STREAM.MSG.GET.{T.stream}", readers),
        Pub(f"$JS.API.CONSUMER.DELETE.{T.stream}.rdx", readers),
        # bounded reads pull from their own ephemeral consumers (random names)
        Pub(f"$JS.API.CONSUMER.MSG.NEXT.{SHARD}.rdx", readers),
        Pub(f"$JS.API.CONSUMER.DELETE.{SHARD}.rdx", readers),
        # another user's ephemeral consumer outside the chunk streams: nobody's to delete
        Pub(f"$JS.API.CONSUMER.DELETE.{T.events_stream}.rdx"),
        Pub(f"$JS.API.CONSUMER.DELETE.KV_{T.steps_bucket}.rdx"),
        # the bucket: the gateway's, read by the operator
        Pub(f"$JS.API.DIRECT.GET.KV_{T.steps_bucket}.$KV.{T.steps_bucket}.sess-x", readers),
        # stream info and lists: the operator, and the gateway (readiness of every shard,
        # where a session lives)
        Pub("$JS.API.STREAM.INFO.TOKENWIRE_DLQ", readers),
        Pub("$JS.API.STREAM.LIST", readers),
    ]
    # subscriptions: one's own inbox only; core subjects of the data path to nobody
    entries += [
        Sub(s) for s in ("_INBOX.>", ">", "$JS.>", "tw.>", "tw.in.>", "tw.chunks.>", "$KV.>")
    ]
    entries += [Sub(f"_INBOX.{user}.>", _users(user)) for user in (*USERS, "provisioner")]
    entries += [Sub("tw.events.>", _users("operator")), Sub("tw.telemetry.>", _users("operator"))]
    return entries


def refused(user: str) -> list[Pub | Sub]:
    return [e for e in catalogue() if user not in e.allowed]


def _single_node(tmp_path: Path) -> Node:
    port = free_port()
    return Node(_single_node_config(tmp_path, port), NodePorts(port, 0, 0), "single")


def _violation_for(conn: Connection, entry: Pub | Sub) -> bool:
    kind = "publish" if isinstance(entry, Pub) else "subscription"
    needle = f'permissions violation for {kind} to "{entry.subject}"'.lower()
    return any(needle in v.lower() for v in conn.violations())


async def _attempt_all(conn: Connection, entries: list[Pub | Sub]) -> None:
    for entry in entries:
        if isinstance(entry, Pub):
            await conn.nc.publish(entry.subject, entry.body, reply=conn.nc.new_inbox())
        else:
            await conn.nc.subscribe(entry.subject)
    await conn.nc.flush(timeout=5)


async def _missing_violations(conn: Connection, entries: list[Pub | Sub]) -> list[str]:
    """The entries the server did not refuse, waited for within the bound."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + VIOLATION_BOUND_S
    while True:
        missing = [e.subject for e in entries if not _violation_for(conn, e)]
        if not missing or loop.time() > deadline:
            return missing
        await asyncio.sleep(0.05)


async def _durables_unchanged(conn: Connection) -> dict[str, int]:
    js = conn.nc.jetstream()
    return {d: int((await js.consumer_info(T.stream, d)).config.max_deliver or 0) for d in DURABLES}


def test_the_catalogue_refuses_something_to_everyone() -> None:
    """The oracle itself: every user has work to be refused, every entry binds someone."""
    assert all(len(refused(user)) > 60 for user in USERS)
    assert all(len(e.allowed) < len(USERS) for e in catalogue())


@pytest.mark.slow
async def test_every_api_and_subject_outside_a_role_is_refused(tmp_path: Path) -> None:
    node = _single_node(tmp_path)
    with running([node]):
        provision(node.url("provisioner"), replicas=1)
        operator = await connect_as("operator", node.url("operator"))
        try:
            before = await _durables_unchanged(operator)
            assert set(before.values()) == {DEFAULT_MAX_DELIVER}
            missing: dict[str, list[str]] = {}
            for user in USERS:
                conn = await connect_as(user, node.url(user))
                try:
                    await _attempt_all(conn, refused(user))
                    missing[user] = await _missing_violations(conn, refused(user))
                finally:
                    await close(conn)
            assert missing == {user: [] for user in USERS}
            assert await _durables_unchanged(operator) == before
        finally:
            await close(operator)
