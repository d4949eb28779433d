"""A delivery the broker made that never reached the assembler is read back, not waited for.

When a broker node dies (the consumer's leader, or the node the assembler is connected to),
messages the server already counted as delivered to the pinned assembler can be lost on the
way. The pin may survive, so no take-over runs, and the server redelivers them only after
``ack_wait`` (300 s by default), long after the step's gap timeout. These tests lose one
delivery on purpose (a seam in the real consumer: the message is dropped on arrival, the
server saw it delivered) against a real nats-server whose ``ack_wait`` is far beyond the
test's bound, and check the store ends up exactly as published: the gap is noticed (a jump
in the consumer sequence, or the server having delivered more than arrived) and the missing
chunks are read back from the stream. A read-back served by a replica still catching up
(a node just restarted) ends short without an error; it must fail and be tried again, not
count as done. The last test checks the other half of the order argument: messages handed
back (naked) by an owner come to the next one in stream order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from nats.aio.client import Client

from tests.assembler.harness import Plan, check_store, eventually, publish_one, settings_for
from tests.assembler.scripts import text_step
from tests.fixtures.broker import provisioned
from tokenwire.broker import (
    ChunkPublisher,
    ConsumedMessage,
    PullSettings,
    Topology,
    connect,
    partition_consumer,
    partition_of,
    read_range,
)
from tokenwire.schemas import ChunkEnvelope, chunk_envelopes
from tokenwire.services.assembler import Assembler, AssemblyConfig, _takeover
from tokenwire.services.assembler._consume import Delivery, nak_tokens
from tokenwire.store import Store

BOUND_S = 30.0
"""How long the store may take to hold every step: far below ack_wait and the gap timeout."""


@pytest.fixture
async def slow_redelivery(nc: Client) -> AsyncIterator[Topology]:
    """A topology whose consumers redeliver only after 300 s (the production default)."""
    async with provisioned(nc, partitions=2, ack_wait_s=300.0) as t:
        yield t


def lose_first_delivery(assembler: Assembler, lost: Callable[[ChunkEnvelope], bool]) -> list[int]:
    """Drop, on arrival, the first delivery of every message ``lost`` selects; returns the
    stream sequences dropped (filled in as they happen)."""
    dropped: list[int] = []
    for consumer in assembler.partitions.consumers.values():
        deliver = consumer._on_delivery

        def maybe_drop(
            cm: ConsumedMessage, deliver: Callable[[ConsumedMessage], None] = deliver
        ) -> None:
            if cm.num_delivered == 1 and lost(chunk_envelopes(cm.data)[0]):
                dropped.append(cm.stream_seq)
                return
            deliver(cm)

        # A seam in the real consumer, on purpose: mypy forbids assigning to a method.
        consumer._on_delivery = maybe_drop  # type: ignore[method-assign]  # the fault: a delivery dropped on arrival
    return dropped


async def publish_in_order(nc: Client, topology: Topology, plan: Plan) -> None:
    publisher = await ChunkPublisher(nc, topology).start()
    try:
        for steps in plan.steps.values():
            for *_, envs in steps:
                for env in envs:
                    await publish_one(publisher, env)
        await publisher.flush(10)
    finally:
        await publisher.close()


async def holds_every_step(store: Store, plan: Plan) -> bool:
    stored = 0
    for session in plan.steps:
        stored += len(await store.messages(session))
    return stored == sum(len(steps) for steps in plan.steps.values())


def two_turns(session: str) -> Plan:
    plan = Plan()
    plan.add(session, 0, 0, text_step(["one ", "two ", "three ", "four"]))
    plan.add(session, 1, 0, text_step(["five ", "six"]))
    return plan


LOSSES = [
    # later chunks arrive: the consumer sequence jumps under the same pin
    ("lost", lambda env: env.turn == 0 and env.ordinal == 1),
    # nothing arrives after it: the server reports more delivered than arrived
    ("tail", lambda env: env.turn == 1 and env.ordinal == 3),
]


@contextlib.asynccontextmanager
async def lossy_assembler(
    nats_url: str,
    t: Topology,
    db_url: str,
    db: Store,
    name: str,
    lost: Callable[[ChunkEnvelope], bool],
) -> AsyncIterator[tuple[Assembler, list[int]]]:
    """A started assembler (gap and abandonment far beyond the test's bound) whose first
    delivery matching ``lost`` is dropped on arrival; yields it and the sequences dropped."""
    timeouts = AssemblyConfig(gap_timeout_s=120.0, abandon_timeout_s=120.0)
    settings = settings_for(nats_url, t, db_url, burst=False, assembly=timeouts)
    own = await connect(nats_url, name=name)
    assembler = Assembler(settings, own, db)
    await assembler.start()
    try:
        yield assembler, lose_first_delivery(assembler, lost)
    finally:
        await assembler.close()
        await own.close()


@pytest.mark.parametrize(("where", "lost"), LOSSES)
async def test_a_delivery_lost_on_the_way_is_read_back_and_the_store_is_exact(
    *,
    nc: Client,
    nats_url: str,
    slow_redelivery: Topology,
    db_url: str,
    db: Store,
    where: str,
    lost: Callable[[ChunkEnvelope], bool],
) -> None:
    plan = two_turns(f"lost-{where}")
    lossy = lossy_assembler(nats_url, slow_redelivery, db_url, db, f"lossy-{where}", lost)
    async with lossy as (assembler, dropped):
        await publish_in_order(nc, slow_redelivery, plan)
        await eventually(
            lambda: holds_every_step(db, plan),
            BOUND_S,
            f"both steps stored although one delivery was lost ({where})",
        )
        assert len(dropped) == 1, dropped
        await check_store(db, plan)
        read_backs = assembler.metrics.read_backs.labels(where, "ok")._value.get()
        assert read_backs >= 1, f"stored, but not through a {where} read-back"


def replica_catching_up(
    monkeypatch: pytest.MonkeyPatch, holds_below: Callable[[], int | None]
) -> list[int]:
    """The read-back's first read that needs more than ``holds_below()`` is served by a
    replica that holds only the messages below it: the ordered read ends there, without an
    error (broker.read_range stops where its consumer's pending count reaches 0, and that
    count is the replica's). Later reads see every message. Returns where the short read
    ended (filled in when it happens)."""
    real = read_range  # the broker's, which the read-back calls
    short: list[int] = []

    async def read(*args: Any, last: int | None, **kwargs: Any) -> AsyncIterator[tuple[int, bytes]]:
        end = holds_below()
        highest = 0
        async for seq, data in real(*args, last=last, **kwargs):
            if not short and end is not None and seq >= end:
                short.append(highest)
                return  # the replica's pending count reached 0 at its last message
            highest = seq
            yield seq, data

    monkeypatch.setattr(_takeover, "read_range", read)
    return short


@pytest.mark.parametrize(("where", "lost"), LOSSES)
async def test_a_read_back_cut_short_by_a_lagging_replica_is_read_again(
    *,
    nc: Client,
    nats_url: str,
    slow_redelivery: Topology,
    db_url: str,
    db: Store,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
    lost: Callable[[ChunkEnvelope], bool],
) -> None:
    """A lost delivery, and the first read-back of it served by a replica two messages
    behind (it holds neither the lost message nor the last one that arrived before it): the
    short read fails and the next attempt, on a replica that caught up, finds the message.
    Before, the short read counted as a read-back done and the step waited for its gap."""
    plan = two_turns(f"lagging-{where}")
    lossy = lossy_assembler(nats_url, slow_redelivery, db_url, db, f"lagging-{where}", lost)
    async with lossy as (assembler, dropped):
        short = replica_catching_up(monkeypatch, lambda: dropped[0] - 1 if dropped else None)
        await publish_in_order(nc, slow_redelivery, plan)
        await eventually(
            lambda: holds_every_step(db, plan),
            BOUND_S,
            f"both steps stored although the first read-back ended short ({where})",
        )
        assert len(dropped) == 1, dropped
        assert short, "no read-back was served short"
        await check_store(db, plan)
        assert assembler.metrics.read_backs.labels(where, "ok")._value.get() >= 1


async def test_handed_back_messages_come_back_in_stream_order(
    nc: Client, slow_redelivery: Topology
) -> None:
    """A hand-over naks the open steps' messages; whatever order they are held in (by last
    activity), the next owner receives them in stream order (the server's redelivery queue
    is first come, first served, so the naks must be sent in stream order)."""
    t = slow_redelivery
    plan = Plan()
    plan.add("handback", 0, 0, text_step(["a", "b", "c"]))
    plan.add("handback", 1, 0, text_step(["d", "e"]))
    await publish_in_order(nc, t, plan)
    p = partition_of("handback", t.partitions)
    deliveries: list[list[ConsumedMessage]] = []
    arrived = asyncio.Event()

    async def take(batch: list[ConsumedMessage]) -> None:
        deliveries.append(batch)
        if sum(len(b) for b in deliveries) >= 2 * plan.chunk_count:
            arrived.set()

    settings = PullSettings(batch=64, auto_ack=False)
    consumer = await partition_consumer(nc, t, p, settings=settings, batch_handler=take).start()
    try:
        await eventually(_at_least(deliveries, plan.chunk_count), 10, "the first deliveries")
        first = [cm for batch in deliveries for cm in batch]
        seqs = [cm.stream_seq for cm in first]
        # held by last activity: the later step's messages first, then the earlier one's
        scrambled = [Delivery(cm.stream_seq, cm, p) for cm in reversed(first)]
        assert await nak_tokens(scrambled) == 0
        await asyncio.wait_for(arrived.wait(), 10)
    finally:
        await consumer.stop(release=False)
    again = [cm for batch in deliveries for cm in batch][len(first) :]
    assert [cm.stream_seq for cm in again] == seqs == sorted(seqs)
    assert all(cm.num_delivered == 2 for cm in again)


def _at_least(deliveries: list[list[ConsumedMessage]], n: int) -> Callable[[], Awaitable[bool]]:
    async def enough() -> bool:
        return sum(len(b) for b in deliveries) >= n

    return enough
