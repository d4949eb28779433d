"""One contract suite for each broker seam the gateway runs on, over the real implementation
(on the real server) and its in-memory twin: what a gateway unit test learns from a twin holds
for the real part. The store's contract suite (tests/store/) is the model.

The expected values are the contract's (docs/broker.md, ``broker._protocol``), never one
implementation's output checked against the other's.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
import pytest
from nats.aio.client import Client

from tokenwire.broker import (
    AMBIGUOUS,
    BrokerUnavailable,
    ChunkPublisher,
    ChunkSink,
    KeyBinding,
    MemoryPublisher,
    MemorySessionOwners,
    MemoryStepRegistry,
    Owner,
    SessionOwners,
    SessionOwnership,
    StepAllocator,
    StepClaimConflict,
    StepNames,
    StepRegistry,
    ThreadMark,
    Topology,
)
from tokenwire.schemas import ChunkEnvelope, TextDelta, json_encoder


@pytest.fixture(params=["real", "memory"])
async def sink(
    request: pytest.FixtureRequest, nc: Client, topology: Topology
) -> AsyncIterator[ChunkSink]:
    if request.param == "memory":
        yield MemoryPublisher()
        return
    publisher = await ChunkPublisher(nc, topology).start()
    try:
        yield publisher
    finally:
        await publisher.close()


@pytest.fixture(params=["real", "memory"])
async def steps(
    request: pytest.FixtureRequest, nc: Client, topology: Topology
) -> AsyncIterator[StepAllocator]:
    if request.param == "memory":
        yield MemoryStepRegistry()
        return
    registry = await StepRegistry.open(nc, topology)
    try:
        yield registry
    finally:
        await registry.close()


def _envelope(session: str, ordinal: int) -> bytes:
    chunk = TextDelta(index=0, text=f"t{ordinal}")
    envelope = ChunkEnvelope(
        session=session,
        turn=0,
        step=0,
        ordinal=ordinal,
        time_ns=1,
        provider="p",
        model="m",
        chunk=chunk,
    )
    return json_encoder.encode(envelope)


async def test_published_chunks_are_acknowledged_and_counted(sink: ChunkSink) -> None:
    before = sink.stats()
    for ordinal in range(5):
        first = ordinal == 0
        await sink.publish(_envelope("twin-a", ordinal), "twin-a", 0, 0, ordinal, first=first)
    await sink.wait_acked("twin-a", 0, 0, timeout_s=10.0)
    after = sink.stats()
    assert after.published - before.published == 5
    assert after.acked - before.acked == 5
    assert after.in_flight == 0


async def test_waiting_on_a_step_with_nothing_published_returns(sink: ChunkSink) -> None:
    await sink.wait_acked("twin-none", 0, 0, timeout_s=5.0)


async def test_a_claimed_triple_cannot_be_claimed_again(steps: StepAllocator) -> None:
    await steps.claim("twin-c", 2, 3)
    with pytest.raises(StepClaimConflict) as caught:
        await steps.claim("twin-c", 2, 3)
    assert (caught.value.session, caught.value.turn, caught.value.step) == ("twin-c", 2, 3)
    await steps.claim("twin-c", 2, 4)  # another triple of the same session is free


async def _next(steps: StepAllocator, session: str, new_turn: bool) -> tuple[int, int]:
    return await (await steps.begin_next_step(session, new_turn)).result()


async def test_assignment_follows_turns_and_steps(steps: StepAllocator) -> None:
    assert await _next(steps, "twin-n", new_turn=True) == (0, 0)
    assert await _next(steps, "twin-n", new_turn=False) == (0, 1)
    assert await _next(steps, "twin-n", new_turn=True) == (1, 0)
    assert await _next(steps, "twin-n", new_turn=False) == (1, 1)
    assert await _next(steps, "twin-other", new_turn=False) == (0, 0)  # a new session


async def test_assignment_skips_an_explicitly_claimed_triple(steps: StepAllocator) -> None:
    assert await _next(steps, "twin-s", new_turn=True) == (0, 0)
    await steps.claim("twin-s", 0, 1)
    assert await _next(steps, "twin-s", new_turn=False) == (0, 2)
    with pytest.raises(StepClaimConflict):
        await steps.claim("twin-s", 0, 2)  # assigned triples are claimed too


async def test_a_dropped_assignment_leaves_the_registry_usable(steps: StepAllocator) -> None:
    (await steps.begin_next_step("twin-d", True)).drop()
    turn, step = await _next(steps, "twin-d", new_turn=True)
    assert (turn, step) in {(0, 0), (1, 0)}  # whether the dropped one landed is not specified


async def test_the_memory_publisher_fails_like_a_lost_broker() -> None:
    sink = MemoryPublisher(fail_after=1)
    await sink.publish(_envelope("twin-f", 0), "twin-f", 0, 0, 0, first=True)
    with pytest.raises(BrokerUnavailable):
        await sink.publish(_envelope("twin-f", 1), "twin-f", 0, 0, 1, first=False)
    with pytest.raises(BrokerUnavailable):
        await MemoryPublisher(fail_acks=True).wait_acked("twin-f", 0, 0)


RetainStep = Callable[[str, "str | None"], Awaitable[None]]
"""Makes the stream retain a step of the session whose first chunk names the tenant."""


@pytest.fixture(params=["real", "memory"])
async def owners(
    request: pytest.FixtureRequest, nc: Client, topology: Topology
) -> AsyncIterator[tuple[SessionOwnership, RetainStep]]:
    if request.param == "memory":
        memory = MemorySessionOwners()

        async def remember(session: str, tenant: str | None) -> None:
            memory.retained_owners.setdefault(session, Owner(tenant))

        yield memory, remember
        return
    publisher = await ChunkPublisher(nc, topology).start()
    turns = iter(range(1000))

    async def publish(session: str, tenant: str | None) -> None:
        chunk = TextDelta(index=0, text="x")
        turn = next(turns)
        envelope = ChunkEnvelope(
            session=session,
            turn=turn,
            step=0,
            ordinal=0,
            time_ns=1,
            provider="p",
            model="m",
            chunk=chunk,
            tenant=msgspec.UNSET if tenant is None else tenant,
        )
        await publisher.publish(json_encoder.encode(envelope), session, turn, 0, 0, first=True)
        await publisher.wait_acked(session, turn, 0, timeout_s=10.0)

    try:
        yield SessionOwners(nc, topology), publish
    finally:
        await publisher.close()


async def test_a_session_no_one_wrote_has_no_retained_owner(
    owners: tuple[SessionOwnership, RetainStep],
) -> None:
    registry, _ = owners
    assert await registry.retained("twin-unknown") is None


async def test_the_first_retained_step_names_the_owner(
    owners: tuple[SessionOwnership, RetainStep],
) -> None:
    registry, retain = owners
    await retain("twin-o", "team-a")
    await retain("twin-o", "team-b")  # a later step does not change the first one's tenant
    await retain("twin-none", None)
    assert await registry.retained("twin-o") == Owner("team-a")
    assert await registry.retained("twin-none") == Owner(None)


async def test_the_first_owner_record_wins(owners: tuple[SessionOwnership, RetainStep]) -> None:
    registry, _ = owners
    assert await registry.adopt("twin-r", Owner("team-a")) == Owner("team-a")
    assert await registry.adopt("twin-r", Owner("team-b")) == Owner("team-a")
    assert await registry.adopt("twin-r", Owner(None)) == Owner("team-a")
    assert await registry.adopt("twin-r2", Owner(None)) == Owner(None)
    assert await registry.adopt("twin-r2", Owner("team-a")) == Owner(None)


async def test_two_writers_of_a_new_session_at_once_get_one_owner(
    owners: tuple[SessionOwnership, RetainStep],
) -> None:
    registry, _ = owners
    for n in range(5):
        a, b = await asyncio.gather(
            registry.adopt(f"twin-race-{n}", Owner("team-a")),
            registry.adopt(f"twin-race-{n}", Owner("team-b")),
        )
        assert a == b
        assert a in (Owner("team-a"), Owner("team-b"))


async def test_a_claim_keeps_its_record_and_its_names(steps: StepAllocator) -> None:
    assert await steps.record("twin-rec", 0, 0) is None
    await steps.claim("twin-rec", 0, 0, "fp-1")
    record = await steps.record("twin-rec", 0, 0)
    assert record is not None
    assert (record.fingerprint, record.names) == ("fp-1", None)
    assert record.time_ns > 0
    await steps.name_step("twin-rec", 0, 0, StepNames("chatcmpl-1", "m", 7))
    named = await steps.record("twin-rec", 0, 0)
    assert named is not None
    assert (named.fingerprint, named.names) == ("fp-1", StepNames("chatcmpl-1", "m", 7))
    assert named.token == record.token
    pending = await steps.begin_next_step("twin-rec", True, "fp-2")
    turn, step = await pending.result()
    assigned = await steps.record("twin-rec", turn, step)
    assert assigned is not None
    assert assigned.fingerprint == "fp-2"


async def test_an_idempotency_key_maps_to_its_first_step_within_its_ttl(
    steps: StepAllocator,
) -> None:
    first = KeyBinding("twin-key", 0, 0, "fp")
    assert await steps.key_binding("k1", 60.0) is None
    assert await steps.bind_key("k1", first, 60.0) == first
    held = await steps.bind_key("k1", KeyBinding("twin-key", 1, 0, "other"), 60.0)
    assert (held.session, held.turn, held.step, held.fingerprint) == ("twin-key", 0, 0, "fp")
    found = await steps.key_binding("k1", 60.0)
    assert found is not None
    assert (found.turn, found.step) == (0, 0)
    assert await steps.key_binding("k1", 0.0) is None  # past its TTL: no longer in force
    later = KeyBinding("twin-key", 2, 0, "new")
    assert await steps.bind_key("k1", later, 0.0) == later


async def test_a_thread_key_names_its_step_until_another_session_shares_it(
    steps: StepAllocator,
) -> None:
    mark = ThreadMark("twin-thread", 0, 1)
    assert await steps.thread_mark("ab01") is None
    await steps.mark_thread(["ab01", "ab02"], mark)
    assert await steps.thread_mark("ab01") == mark
    assert await steps.thread_mark("ab02") == mark
    later = ThreadMark("twin-thread", 1, 0)  # the same session's later step: moved to it
    await steps.mark_thread(["ab01"], later)
    assert await steps.thread_mark("ab01") == later
    await steps.mark_thread(["ab02"], ThreadMark("twin-other", 0, 0))  # another session
    assert await steps.thread_mark("ab02") == AMBIGUOUS
    await steps.mark_thread(["ab02"], mark)  # once ambiguous, always
    assert await steps.thread_mark("ab02") == AMBIGUOUS
