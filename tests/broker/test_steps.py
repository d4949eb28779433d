"""StepRegistry on the real KV bucket: claims, conflicts, concurrent assignment."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import msgspec
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from tests.fixtures.broker import close_client
from tokenwire.broker import (
    DEFAULT_CLAIM_IDLE_S,
    RegistryBucket,
    StepClaimConflict,
    StepClaims,
    StepRegistry,
    Topology,
    connect,
)
from tokenwire.broker._kvwrite import KvWriter


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


@contextlib.asynccontextmanager
async def instances(
    nats_url: str, topology: Topology, count: int
) -> AsyncIterator[list[StepRegistry]]:
    """``count`` registries, each on its own connection, as separate gateways would have."""
    clients = [await connect(nats_url) for _ in range(count)]
    try:
        yield [await StepRegistry.open(c, topology) for c in clients]
    finally:
        for c in clients:
            await close_client(c)


async def test_concurrent_next_step_across_instances_is_unique(
    nats_url: str, topology: Topology
) -> None:
    async with instances(nats_url, topology, 3) as registries:
        calls = [registries[i % 3].next_step("busy", new_turn=False) for i in range(30)]
        got = await asyncio.gather(*calls)
    assert sorted(got) == [(0, k) for k in range(30)]


async def test_an_instance_with_a_stale_memory_of_the_session_still_assigns_the_next_step(
    nats_url: str, topology: Topology
) -> None:
    """A remembers the session's pointer from its own assignments; B moves it meanwhile. A's
    compare-and-set from its memory then fails, and A reads the pointer before assigning."""
    async with instances(nats_url, topology, 2) as (a, b):
        assert await a.next_step("shared", new_turn=True) == (0, 0)
        assert await a.next_step("shared", new_turn=False) == (0, 1)
        assert await b.next_step("shared", new_turn=False) == (0, 2)
        assert await b.next_step("shared", new_turn=True) == (1, 0)
        assert await a.next_step("shared", new_turn=False) == (1, 1)
        await b.claim("shared", 1, 2)  # explicit: the next assignment skips it
        assert await a.next_step("shared", new_turn=False) == (1, 3)
        assert await b.next_step("shared", new_turn=True) == (2, 0)


async def test_a_stale_memory_never_assigns_a_step_of_a_finished_turn(
    nats_url: str, topology: Topology
) -> None:
    """A remembers turn 0; B starts turn 1. A's continuation must be a step of turn 1, not
    the unclaimed (0, 2) that A's stale pointer would name."""
    async with instances(nats_url, topology, 2) as (a, b):
        assert await a.next_step("moved-on", new_turn=True) == (0, 0)
        assert await a.next_step("moved-on", new_turn=False) == (0, 1)
        assert await b.next_step("moved-on", new_turn=True) == (1, 0)
        assert await a.next_step("moved-on", new_turn=False) == (1, 1)
        assert await b.next_step("moved-on", new_turn=False) == (1, 2)


async def test_a_dropped_assignment_keeps_its_triple_and_the_next_one_moves_past_it(
    nc: Client, topology: Topology
) -> None:
    """A step that ended before it needed its identity drops the assignment it had sent:
    the writes stand (the triple stays claimed, unused) and later assignments are unique."""
    steps = await StepRegistry.open(nc, topology)
    assert await steps.next_step("dropped", new_turn=True) == (0, 0)
    pending = await steps.begin_next_step("dropped", new_turn=False)  # (0, 1), sent
    pending.drop()
    with pytest.raises(StepClaimConflict):
        await steps.claim("dropped", 0, 1)
    assert await steps.next_step("dropped", new_turn=False) == (0, 2)
    await steps.close()


async def test_begin_then_result_is_next_step(nc: Client, topology: Topology) -> None:
    steps = await StepRegistry.open(nc, topology)
    first = await steps.begin_next_step("halves", new_turn=True)  # nothing remembered: read
    assert await first.result() == (0, 0)
    second = await steps.begin_next_step("halves", new_turn=True)  # remembered: sent at once
    assert await second.result() == (1, 0)
    await steps.close()


async def test_a_write_nobody_acknowledges_fails_within_the_bound(
    nc: Client, topology: Topology
) -> None:
    """A subscriber that swallows the KV writes (a responder that never answers): the claim
    and the assignment end with StepRegistryError after ``timeout_s``, not never."""
    from tokenwire.broker import StepRegistryError

    swallowed: list[str] = []

    async def swallow(msg: Msg) -> None:
        swallowed.append(msg.subject)

    await nc.subscribe("$KV.silent.>", cb=swallow)
    kv = await nc.jetstream().key_value(topology.steps_bucket)
    writer = await KvWriter(nc, "silent").start()
    steps = StepRegistry([RegistryBucket(kv, writer)], timeout_s=0.3, retries=2, retry_s=5.0)
    bounded = r"no KV ack within 0\.3 s \(after 2 retries within 5\.0 s\)"
    with pytest.raises(StepRegistryError, match=bounded):
        await steps.claim("quiet", 0, 0)
    assert swallowed.count("$KV.silent.quiet.0.0") == 3  # sent, then resent twice
    with pytest.raises(StepRegistryError, match=bounded):
        await steps.next_step("quiet", new_turn=True)
    # the total time bounds the retries too: a budget of 0.5 s ends after two 0.25 s waits
    short = StepRegistry([RegistryBucket(kv, writer)], timeout_s=0.25, retries=100, retry_s=0.5)
    with pytest.raises(StepRegistryError, match=r"within 0\.5 s"):
        await short.claim("quieter", 0, 0)
    assert swallowed.count("$KV.silent.quieter.0.0") <= 3
    await steps.close()


class _LosesAcks(KvWriter):
    """Sends every write, but the acks of the first ``lost`` never reach the registry: the
    writes landed, their answers did not (a bucket leader killed after it stored them)."""

    def __init__(self, nc: Client, bucket: str, lost: int) -> None:
        super().__init__(nc, bucket)
        self.lost = lost

    async def put_if(self, key: str, value: bytes, last: int) -> asyncio.Future[int | None]:
        real = await super().put_if(key, value, last)
        if self.lost <= 0:
            return real
        self.lost -= 1
        real.add_done_callback(lambda f: f.cancelled() or f.exception())
        return asyncio.get_running_loop().create_future()  # never answered


async def test_writes_that_landed_unacknowledged_are_resent_and_found_ours(
    nc: Client, topology: Topology
) -> None:
    """The retry inside the registry (a KV leader election): the first assignment's two
    writes land but their acks are lost; the registry resends the same writes, finds the
    claim key holding its own token, and assigns that triple: no 503, no skipped step."""
    kv = await nc.jetstream().key_value(topology.steps_bucket)
    writer = await _LosesAcks(nc, topology.steps_bucket, lost=2).start()
    assert isinstance(writer, _LosesAcks)
    steps = StepRegistry(
        [RegistryBucket(kv, writer)], timeout_s=0.3, retries=4, retry_s=10.0, js=nc.jetstream()
    )
    assert await steps.next_step("lossy", new_turn=True) == (0, 0)
    assert writer.lost == 0
    assert await steps.next_step("lossy", new_turn=False) == (0, 1)
    writer.lost = 1  # an explicit claim whose ack is lost is ours too
    await steps.claim("lossy", 0, 2)
    with pytest.raises(StepClaimConflict):  # and still nobody else's
        await steps.claim("lossy", 0, 2)
    assert await steps.next_step("lossy", new_turn=False) == (0, 3)
    await steps.close()


async def test_a_fresh_session_is_assigned_without_reading_its_pointer(
    nc: Client, topology: Topology
) -> None:
    """A conversation's first call (``fresh``): the session is guessed new and its (0, 0) sent
    at once, with no read of the pointer before it."""
    steps = await StepRegistry.open(nc, topology)

    async def no_read(session: str) -> None:
        raise AssertionError(f"the pointer of {session} was read")

    steps._read = no_read  # type: ignore[method-assign, assignment]
    assert await (await steps.begin_next_step("fresh-1", True, fresh=True)).result() == (0, 0)
    with pytest.raises(StepClaimConflict):
        await steps.claim("fresh-1", 0, 0)
    assert await steps.next_step("fresh-1", new_turn=False) == (0, 1)  # remembered
    await steps.close()


async def test_a_fresh_guess_for_a_session_served_elsewhere_reads_and_continues(
    nats_url: str, topology: Topology
) -> None:
    async with instances(nats_url, topology, 2) as (a, b):
        assert await a.next_step("served", new_turn=True) == (0, 0)
        assert await a.next_step("served", new_turn=False) == (0, 1)
        guessed = await b.begin_next_step("served", new_turn=True, fresh=True)
        assert await guessed.result() == (1, 0)
        assert await a.next_step("served", new_turn=False) == (1, 1)


async def test_a_fresh_guess_never_reuses_a_first_step_whose_claim_expired(
    nc: Client, topology: Topology, nats_url: str
) -> None:
    """The session's (0, 0) claim is gone (the bucket's TTL) but later steps kept its pointer:
    the guessed (0, 0) claim is created, yet not taken: the next step follows the pointer."""
    async with instances(nats_url, topology, 2) as (a, b):
        for expected in ((0, 0), (0, 1), (0, 2)):
            assert await a.next_step("old", new_turn=False) == expected
        bucket = topology.steps_bucket
        await nc.jetstream().purge_stream(f"KV_{bucket}", subject=f"$KV.{bucket}.old.0.0")
        guessed = await b.begin_next_step("old", new_turn=False, fresh=True)
        assert await guessed.result() == (0, 3)
        with pytest.raises(StepClaimConflict):
            await a.claim("old", 0, 0)  # the guess's claim stays, unused


async def test_fresh_guesses_for_one_new_session_at_once_stay_unique(
    nats_url: str, topology: Topology
) -> None:
    """Several gateways starting the same new session at the same moment: every triple once
    (a guess that lost the pointer leaves its claim unused: a gap, never a duplicate)."""
    async with instances(nats_url, topology, 3) as registries:
        calls = [r.begin_next_step("race", new_turn=False, fresh=True) for r in registries * 4]
        got = await asyncio.gather(*[(await c).result() for c in calls])
    assert len(set(got)) == len(got) == 12
    assert all(turn == 0 for turn, _ in got)


async def test_a_guess_whose_writes_landed_unacknowledged_is_still_ours(
    nc: Client, topology: Topology
) -> None:
    """A guessed (0, 0) whose two writes land but whose acks are lost (a leader election):
    the resent pointer create fails on our own pointer, the claim holds our token, and the
    pointer names (0, 0): the step is ours, no gap."""
    kv = await nc.jetstream().key_value(topology.steps_bucket)
    writer = await _LosesAcks(nc, topology.steps_bucket, lost=2).start()
    steps = StepRegistry(
        [RegistryBucket(kv, writer)], timeout_s=0.3, retries=4, retry_s=10.0, js=nc.jetstream()
    )
    guessed = await steps.begin_next_step("lossy-fresh", new_turn=True, fresh=True)
    assert await guessed.result() == (0, 0)
    assert await steps.next_step("lossy-fresh", new_turn=False) == (0, 1)
    await steps.close()


async def test_a_claim_keeps_the_gateway_s_silence_bound_and_the_assembler_reads_it(
    nc: Client, topology: Topology
) -> None:
    """Issue 48: the assembler reads a claim (``StepClaims``, one direct get) before it
    records a step abandoned; the claim says how long its gateway may stay silent."""
    steps = await StepRegistry.open(nc, topology, idle_s=95.0)
    claims = StepClaims(nc, topology)
    try:
        before = time.time_ns()
        await steps.claim("s-idle", 0, 0)
        assert await steps.next_step("s-idle", False) == (0, 1)
        for step in (0, 1):
            record = await claims.record("s-idle", 0, step)
            assert record is not None
            assert record.idle_s == 95.0
            same = await steps.record("s-idle", 0, step)  # as the registry reads it
            assert same is not None
            assert msgspec.structs.replace(record, time_ns=0) == msgspec.structs.replace(
                same, time_ns=0
            )
            assert abs(record.time_ns - same.time_ns) < 10_000  # both from a float timestamp
            assert before - 5e9 <= record.time_ns <= time.time_ns() + 5e9  # the broker's clock
        assert await claims.record("s-idle", 0, 2) is None
        older = await StepRegistry.open(nc, topology)  # a gateway of before: no bound stated
        await older.claim("s-idle", 1, 0)
        record = await claims.record("s-idle", 1, 0)
        assert record is not None
        assert (record.idle_s, record.silence_s()) == (0.0, DEFAULT_CLAIM_IDLE_S)
        await older.close()
    finally:
        await steps.close()
