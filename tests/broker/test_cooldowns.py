"""The shared cooldowns' contract (``broker.CooldownBoard``, docs/broker.md "Deployment
cooldowns"), over the real bucket on the real server and the in-memory twin: a cooldown
reaches every watcher, ends by the broker's TTL into a probe that exactly one claimant wins,
and a cleared deployment is healthy. Waits are on conditions, bounded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from nats.aio.client import Client

from tokenwire.broker import (
    CooldownBoard,
    Cooldowns,
    Cooling,
    DeploymentState,
    Healthy,
    MemoryCooldowns,
    ProbeDue,
    Probing,
    RequestFailed,
    Topology,
    ensure_cooldowns_bucket,
    stream_info,
)


@pytest.fixture(params=["real", "memory"])
async def board(
    request: pytest.FixtureRequest, nc: Client, topology: Topology
) -> AsyncIterator[CooldownBoard]:
    if request.param == "memory":
        yield MemoryCooldowns()
        return
    yield Cooldowns(nc, topology.cooldowns_bucket)


class Seen:
    """What a watch delivered, and a bounded wait for a condition on it."""

    def __init__(self) -> None:
        self.states: list[DeploymentState] = []
        self.changed = asyncio.Event()

    def __call__(self, state: DeploymentState) -> None:
        self.states.append(state)
        self.changed.set()

    async def until(
        self, test: Callable[[DeploymentState], bool], timeout_s: float = 10
    ) -> DeploymentState:
        async with asyncio.timeout(timeout_s):
            while True:
                for state in self.states:
                    if test(state):
                        return state
                self.changed.clear()
                await self.changed.wait()


async def test_a_cooldown_reaches_every_watcher_and_ends_in_one_probe(board: CooldownBoard) -> None:
    first, second = Seen(), Seen()
    watches = [await board.watch(first), await board.watch(second)]
    try:
        await board.cool("west", reason="429 retry-after 1 s", seconds=1)
        for seen in (first, second):
            cooling = await seen.until(lambda s: isinstance(s, Cooling))
            assert isinstance(cooling, Cooling)
            assert cooling.reason == "429 retry-after 1 s"
        due = await first.until(lambda s: isinstance(s, ProbeDue))
        assert isinstance(due, ProbeDue)
        claims = await asyncio.gather(
            *(board.claim_probe("west", revision=due.revision, seconds=5) for _ in range(5))
        )
        assert sum(claim.won for claim in claims) == 1
        assert all(isinstance(claim.state, Probing) for claim in claims)
        await second.until(lambda s: isinstance(s, Probing))
        await board.clear("west")
        await second.until(lambda s: isinstance(s, Healthy) and s.revision > due.revision)
        assert isinstance(await board.state("west"), Healthy)
    finally:
        for watch in watches:
            await watch.stop()


async def test_a_late_watcher_learns_the_current_states(board: CooldownBoard) -> None:
    await board.cool("east", reason="3 failures in 30 s", seconds=30)
    seen = Seen()
    watch = await board.watch(seen)
    try:
        cooling = await seen.until(lambda s: s.deployment == "east")
        assert isinstance(cooling, Cooling)
        assert [s.deployment for s in await board.states()] == ["east"]
    finally:
        await watch.stop()


async def test_a_claim_on_a_stale_revision_loses_and_says_what_holds(board: CooldownBoard) -> None:
    await board.cool("south", reason="x", seconds=30)
    claim = await board.claim_probe("south", revision=10_000, seconds=5)
    assert not claim.won
    assert isinstance(claim.state, Cooling)
    assert isinstance(await board.state("nowhere"), Healthy)


class ReadFails(Cooldowns):
    """The real board whose reads of a deployment's state get no answer (the broker answered
    the claim's write, then did not answer the read that follows it)."""

    async def state(self, deployment: str) -> DeploymentState:
        raise RequestFailed(f"cooldown of {deployment}", "TimeoutError (a read that failed)")


async def test_a_lost_claim_stays_lost_when_what_holds_cannot_be_read(
    nc: Client, topology: Topology
) -> None:
    """The broker refused the claim (another's write came first) and the read of what holds
    failed: the claim is lost (before: the read's error made the gateway take the broker for
    away and probe on its own, a second probe beside the winner's)."""
    board = ReadFails(nc, topology.cooldowns_bucket)
    await board.cool("north", reason="x", seconds=30)
    claim = await board.claim_probe("north", revision=10_000, seconds=5)
    assert not claim.won
    assert claim.state.deployment == "north"
    assert not isinstance(claim.state, (Healthy, ProbeDue))  # held back: the watch says by what


async def test_the_bucket_carries_per_message_ttls(nc: Client, topology: Topology) -> None:
    """Provisioning makes the bucket with per-message TTLs and expiry markers, and making it
    again (a gateway that finds it missing) is a no-op."""
    await ensure_cooldowns_bucket(nc, topology)
    config = (await stream_info(nc, f"KV_{topology.cooldowns_bucket}"))["config"]
    assert config["allow_msg_ttl"] is True
    assert config["subject_delete_marker_ttl"] > 0
    assert config["storage"] == "file"
