"""StepRegistry on the real KV bucket: claims, conflicts, concurrent assignment."""

from __future__ import annotations

import asyncio

import pytest
from nats.aio.client import Client

from tests.fixtures.broker import close_client
from tokenwire.broker import StepClaimConflict, StepRegistry, Topology, connect


async def test_claim_then_conflict(nc: Client, topology: Topology) -> None:
    steps = await StepRegistry.open(nc, topology)
    await steps.claim("s1", 0, 0)
    await steps.claim("s1", 0, 1)
    with pytest.raises(StepClaimConflict) as caught:
        await steps.claim("s1", 0, 0)
    assert (caught.value.session, caught.value.turn, caught.value.step) == ("s1", 0, 0)


async def test_next_step_advances_steps_and_turns(nc: Client, topology: Topology) -> None:
    steps = await StepRegistry.open(nc, topology)
    got = [
        await steps.next_step("s2", new_turn=True),
        await steps.next_step("s2", new_turn=False),
        await steps.next_step("s2", new_turn=False),
        await steps.next_step("s2", new_turn=True),
        await steps.next_step("s2", new_turn=False),
    ]
    assert got == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
    with pytest.raises(StepClaimConflict):
        await steps.claim("s2", 1, 1)  # next_step claimed what it assigned


async def test_next_step_skips_explicitly_claimed_triples(nc: Client, topology: Topology) -> None:
    steps = await StepRegistry.open(nc, topology)
    assert await steps.next_step("s3", new_turn=False) == (0, 0)
    await steps.claim("s3", 0, 1)
    assert await steps.next_step("s3", new_turn=False) == (0, 2)


async def test_concurrent_next_step_across_instances_is_unique(
    nats_url: str, topology: Topology
) -> None:
    clients = [await connect(nats_url) for _ in range(3)]
    try:
        registries = [await StepRegistry.open(c, topology) for c in clients]
        calls = [registries[i % 3].next_step("busy", new_turn=False) for i in range(30)]
        got = await asyncio.gather(*calls)
    finally:
        for c in clients:
            await close_client(c)
    assert sorted(got) == [(0, k) for k in range(30)]
