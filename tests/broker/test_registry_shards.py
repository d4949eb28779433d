"""The step registry over R KV buckets (``TOKENWIRE_REGISTRY_SHARDS``), on a real nats-server:
each session's keys in the one bucket its hash names and in no other, claims that stay unique
across gateway instances, idempotency keys and owner records routed the same way, and a
deployment's R that provisioning refuses to change (docs/operations.md, "The step registry's
shards")."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib

import msgspec
import pytest
from nats.aio.client import Client
from nats.js.errors import KeyNotFoundError

from tests.broker.test_steps import instances
from tests.fixtures.broker import provisioned
from tokenwire.broker import (
    KeyBinding,
    Owner,
    RegistryLayoutConflict,
    SessionOwners,
    StepClaimConflict,
    StepRegistry,
    Topology,
    ensure_topology,
)
from tokenwire.broker._api import api_request
from tokenwire.broker._layout import registry_buckets_found
from tokenwire.broker._step_record import key_binding_key
from tokenwire.broker._topology import topology_from
from tokenwire.config import ConfigError, load


def test_bucket_names_encode_r_and_a_single_bucket_keeps_its_name() -> None:
    one = Topology(steps_bucket="steps")
    four = Topology(steps_bucket="steps", registry_shards=4)
    assert one.registry_buckets == ("steps",)
    assert four.registry_buckets == ("steps-r4-0", "steps-r4-1", "steps-r4-2", "steps-r4-3")
    # "abc" hashes to partition 11 of 16 (partition_of's doctest): 11 mod 4 = 3 of 4
    assert four.registry_bucket_of("abc") == "steps-r4-3"
    assert one.registry_bucket_of("abc") == "steps"
    # independent of the chunk layout: K and P do not move a session's bucket
    resharded = dataclasses.replace(four, shards=4, partitions=32)
    assert resharded.registry_bucket_of("abc") == "steps-r4-3"


@pytest.mark.parametrize("shards", [0, 65])
def test_registry_shards_out_of_bounds_are_refused(shards: int) -> None:
    with pytest.raises(ValueError, match=r"registry_shards must be 1\.\.64"):
        Topology(registry_shards=shards)


def test_registry_shards_from_the_environment() -> None:
    settings = load({"TOKENWIRE_REGISTRY_SHARDS": "4"})
    assert settings.registry_shards == 4
    assert topology_from(settings).registry_shards == 4
    assert load({}).registry_shards == 1
    for bad in ("0", "65", "many"):
        with pytest.raises(ConfigError, match="TOKENWIRE_REGISTRY_SHARDS"):
            load({"TOKENWIRE_REGISTRY_SHARDS": bad})


async def _keys(nc: Client, bucket: str, key: str) -> bytes | None:
    kv = await nc.jetstream().key_value(bucket)
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    return entry.value


async def _only_in(nc: Client, t: Topology, key: str, home: str) -> bytes:
    """``key``'s value in ``home``, asserting that no other registry bucket holds it."""
    found = {b: await _keys(nc, b, key) for b in t.registry_buckets}
    assert [b for b, value in found.items() if value is not None] == [home], key
    value = found[home]
    assert value is not None
    return value


async def test_each_session_lives_in_the_bucket_its_hash_names_and_nowhere_else(
    nc: Client,
) -> None:
    async with provisioned(nc, registry_shards=4) as t:
        for bucket in t.registry_buckets:  # each bucket is a stream (a raft group) of its own
            info = await api_request(nc, f"$JS.API.STREAM.INFO.KV_{bucket}")
            assert info["config"]["subjects"] == [f"$KV.{bucket}.>"]
        steps = await StepRegistry.open(nc, t)
        sessions = [f"rs-{i}" for i in range(24)]
        for session in sessions:
            assert await steps.next_step(session, new_turn=True) == (0, 0)
            assert await steps.next_step(session, new_turn=False) == (0, 1)
        for session in sessions:
            home = t.registry_bucket_of(session)
            pointer = msgspec.json.decode(await _only_in(nc, t, session, home))
            assert pointer == {"turn": 0, "step": 1}
            await _only_in(nc, t, f"{session}.0.0", home)
            await _only_in(nc, t, f"{session}.0.1", home)
        assert {t.registry_bucket_of(s) for s in sessions} == set(t.registry_buckets)
        with pytest.raises(StepClaimConflict):
            await steps.claim(sessions[0], 0, 1)
        await steps.close()


async def test_concurrent_gateways_never_share_a_triple_over_sharded_buckets(
    nc: Client, nats_url: str
) -> None:
    async with provisioned(nc, registry_shards=3) as t, instances(nats_url, t, 3) as registries:
        sessions = [f"cc-{i}" for i in range(12)]
        assigned = await asyncio.gather(
            *(r.next_step(s, new_turn=False) for s in sessions for r in registries for _ in "ab")
        )
        per_session: dict[str, list[tuple[int, int]]] = {}
        for (session, _), triple in zip(
            [(s, r) for s in sessions for r in registries for _ in "ab"], assigned, strict=True
        ):
            per_session.setdefault(session, []).append(triple)
        for session, triples in per_session.items():
            assert sorted(triples) == [(0, k) for k in range(6)], session
        for r in registries:
            await r.close()


async def test_idempotency_keys_and_owner_records_follow_the_same_routing(nc: Client) -> None:
    async with provisioned(nc, registry_shards=4) as t:
        steps = await StepRegistry.open(nc, t)
        hashes = [hashlib.sha256(f"key-{i}".encode()).hexdigest() for i in range(8)]
        for i, key_hash in enumerate(hashes):
            binding = KeyBinding(f"idem-{i}", 0, 0, fingerprint=f"f{i}")
            assert await steps.bind_key(key_hash, binding, ttl_s=60.0) == binding
            held = await steps.key_binding(key_hash, ttl_s=60.0)
            assert held is not None
            assert (held.session, held.fingerprint) == (f"idem-{i}", f"f{i}")
            await _only_in(nc, t, key_binding_key(key_hash), t.registry_bucket_of(key_hash))
        owners = SessionOwners(nc, t)
        for i in range(8):
            session = f"own-{i}"
            assert await owners.adopt(session, Owner(f"tenant-{i}")) == Owner(f"tenant-{i}")
            assert await owners.adopt(session, Owner("late")) == Owner(f"tenant-{i}")
            stored = await _only_in(nc, t, f"{session}.owner", t.registry_bucket_of(session))
            assert msgspec.json.decode(stored) == {"tenant": f"tenant-{i}"}
        await steps.close()


async def test_provisioning_refuses_another_r_and_changes_nothing(nc: Client) -> None:
    async with provisioned(nc, registry_shards=4) as t:
        for other in (1, 2):
            with pytest.raises(RegistryLayoutConflict) as caught:
                await ensure_topology(nc, dataclasses.replace(t, registry_shards=other))
            message = str(caught.value)
            for named in (
                f"R={other}",
                "R=4",
                f"{t.steps_bucket}-r4-0",
                "TOKENWIRE_REGISTRY_SHARDS",
            ):
                assert named in message
            assert await registry_buckets_found(nc, t) == sorted(t.registry_buckets)
        await ensure_topology(nc, t)  # the deployment's own R: idempotent
        assert await registry_buckets_found(nc, t) == sorted(t.registry_buckets)


async def test_a_single_bucket_deployment_refuses_a_sharded_process(nc: Client) -> None:
    async with provisioned(nc) as t:
        with pytest.raises(RegistryLayoutConflict, match=f"R=1: {t.steps_bucket}"):
            await ensure_topology(nc, dataclasses.replace(t, registry_shards=2))
        assert await registry_buckets_found(nc, t) == [t.steps_bucket]
