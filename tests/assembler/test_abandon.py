"""Abandonment asks the broker first (issue 48), on a real nats-server with a real assembler:
a step past its timeout is recorded ``abandoned`` only once its claim's silence bound has
passed since its newest chunk; a step whose claim is live, or whose partition this instance
stopped reading (it fell behind), waits and is stored whole when the rest of it arrives."""

from __future__ import annotations

import time

from nats.aio.client import Client

from tests.assembler.harness import eventually, publish_one, settings_for
from tests.assembler.scripts import envelopes, text_step
from tokenwire.broker import ChunkPublisher, StepRegistry, Topology, connect, partition_of
from tokenwire.schemas import ErrorEvent, MessageEvent
from tokenwire.services.assembler import Assembler, AssemblyConfig
from tokenwire.store import Store, open_store

QUICK = AssemblyConfig(abandon_timeout_s=0.3, gap_timeout_s=0.3)


async def _start(nats_url: str, topology: Topology, sqlite_url: str) -> tuple[Assembler, Store]:
    store = open_store(sqlite_url)
    own = await connect(nats_url)
    settings = settings_for(
        nats_url, topology, sqlite_url, burst=False, assembly=QUICK, priority_timeout_s=2.0
    )
    return await Assembler(settings, own, store).start(), store


async def _stop(assembler: Assembler, store: Store) -> None:
    nc = assembler._nc
    await assembler.close()
    await nc.close()
    await store.close()


def _waited(assembler: Assembler, outcome: str = "waiting") -> float:
    value = assembler.metrics.registry.get_sample_value(
        "tokenwire_assembler_expiry_steps_total", {"outcome": outcome}
    )
    return value or 0.0


def _not_closed(assembler: Assembler) -> float:
    """Due steps kept open: waiting (behind), or handed back (the pin moved meanwhile)."""
    return _waited(assembler) + _waited(assembler, "handed-back")


async def test_a_quiet_step_is_abandoned_only_past_its_claim_s_silence_bound(
    nc: Client, nats_url: str, topology: Topology, sqlite_url: str
) -> None:
    registry = await StepRegistry.open(nc, topology, idle_s=1.5)
    publisher = await ChunkPublisher(nc, topology).start()
    assembler, store = await _start(nats_url, topology, sqlite_url)
    try:
        await registry.claim("quiet", 0, 0)
        now = time.time_ns()
        for env in envelopes("quiet", 0, 0, text_step(["a", "b"]), t0=now)[:2]:
            await publish_one(publisher, env)  # then the gateway dies: no finish, ever
        # due after 0.3 s; kept open while the claim says its gateway may still publish
        await eventually(lambda: _true(_waited(assembler) >= 2), what="two passes waiting")
        assert not await store.messages("quiet") or time.time_ns() > now + 1_500_000_000

        async def recorded() -> bool:
            return bool(await store.messages("quiet"))

        await eventually(recorded, what="the quiet step recorded")
        [outcome] = await store.messages("quiet")
        assert isinstance(outcome, ErrorEvent)
        assert outcome.error.kind == "abandoned"
        assert assembler.metrics.steps.labels("abandoned")._value.get() == 1
    finally:
        await _stop(assembler, store)
        await publisher.close()
        await registry.close()


async def test_a_step_whose_gateway_is_slow_waits_and_is_stored_whole(
    nc: Client, nats_url: str, topology: Topology, sqlite_url: str
) -> None:
    """The claim is live (a gateway riding out a broker outage keeps its chunks for up to
    its ack timeout): the step waits past the abandonment timeout, then completes."""
    registry = await StepRegistry.open(nc, topology, idle_s=60.0)
    publisher = await ChunkPublisher(nc, topology).start()
    assembler, store = await _start(nats_url, topology, sqlite_url)
    try:
        await registry.claim("slow", 0, 0)
        envs = envelopes("slow", 0, 0, text_step(["a", "b", "c"]), t0=time.time_ns())
        for env in envs[:2]:
            await publish_one(publisher, env)
        await eventually(lambda: _true(_waited(assembler) >= 2), what="two passes waiting")
        for env in envs[2:]:
            await publish_one(publisher, env)
        await _whole(store, "slow")
    finally:
        await _stop(assembler, store)
        await publisher.close()
        await registry.close()


async def test_a_step_on_a_partition_this_instance_stopped_reading_is_not_abandoned(
    nc: Client, nats_url: str, topology: Topology, sqlite_url: str
) -> None:
    """Past the claim's silence bound only the broker's evidence keeps the step open: the
    rest of it is retained and undelivered while this instance does not read the partition.
    That is lag; the step is stored whole once it reads again."""
    registry = await StepRegistry.open(nc, topology, idle_s=1.0)
    publisher = await ChunkPublisher(nc, topology).start()
    assembler, store = await _start(nats_url, topology, sqlite_url)
    try:
        await registry.claim("behind", 0, 0)
        t0 = time.time_ns()
        envs = envelopes("behind", 0, 0, text_step(["a", "b", "c"]), t0=t0)
        partition = partition_of("behind", topology.partitions)
        await publish_one(publisher, envs[0])
        consumer = assembler.partitions.consumers[partition]
        await eventually(
            lambda: _true(assembler.assembly.is_open(("behind", 0, 0))), what="the step open"
        )
        assert await consumer.pause(5.0)  # stops reading the partition
        for env in envs[1:]:
            await publish_one(publisher, env)
        bound_ns = t0 + 1_500_000_000  # the claim's 1 s since the chunk, and a margin
        await eventually(lambda: _true(time.time_ns() > bound_ns), what="the claim's bound")
        before = _not_closed(assembler)
        await eventually(lambda: _true(_not_closed(assembler) >= before + 2), what="kept open")
        assert not await store.messages("behind")  # due, past its claim, and not closed
        consumer.resume()
        await _whole(store, "behind")
    finally:
        await _stop(assembler, store)
        await publisher.close()
        await registry.close()


async def _whole(store: Store, session: str) -> None:
    async def stored() -> bool:
        return bool(await store.messages(session))

    await eventually(stored, what=f"{session} stored")
    [outcome] = await store.messages(session)
    assert isinstance(outcome, MessageEvent), outcome
    assert outcome.message.text == "abc"


async def _true(value: bool) -> bool:
    return value
