"""PullConsumer's manual-ack mode and batch handler, against the real server."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections import Counter

import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import NotJSMessageError

from tests.broker.test_consumer import eventually
from tests.fixtures.broker import close_client, drop_topology, fresh_topology
from tokenwire.broker import (
    ChunkPublisher,
    ConsumedMessage,
    PullConsumer,
    PullSettings,
    Reject,
    Retry,
    Topology,
    ack_fields,
    ack_many,
    connect,
    consumer_state,
    ensure_topology,
    partition_consumer,
    partition_of,
)

SMALL = PullSettings(batch=8, expires_s=2.0, standby_expires_s=1.0)
MANUAL = PullSettings(batch=8, expires_s=2.0, standby_expires_s=1.0, auto_ack=False)


async def unsettled(nc: Client, t: Topology, partition: int) -> tuple[int, int]:
    """(num_pending, num_ack_pending) of one partition consumer, from the server."""
    state = await consumer_state(nc, t.stream, t.assembler_consumer(partition))
    assert state is not None
    return state.num_pending, state.num_ack_pending


async def settles_to(nc: Client, t: Topology, partition: int, expected: tuple[int, int]) -> None:
    """Poll the consumer's counts until they equal ``expected`` (bounded by 10 s).

    The server updates a consumer's pending count when the stream signals it, a moment after
    the publish ack, so a count read right after ``flush`` may still lag by a message or two.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    seen = await unsettled(nc, t, partition)
    while seen != expected and loop.time() < deadline:
        await asyncio.sleep(0.05)
        seen = await unsettled(nc, t, partition)
    assert seen == expected


async def fill_partition(nc: Client, t: Topology, count: int) -> int:
    """Publish ``count`` messages to sessions of partition 0 (the stream files them there)."""
    tag = random.randrange(10**9)
    sessions = [
        s for s in (f"m{tag}-{i}" for i in range(400)) if partition_of(s, t.partitions) == 0
    ]
    publisher = await ChunkPublisher(nc, t).start()
    for k in range(count):
        session = sessions[k % 4]
        await publisher.publish(b"c", session, 0, 0, k // 4, first=k < 4)
    await publisher.flush(10)
    await publisher.close()
    await settles_to(nc, t, 0, (count, 0))
    return count


async def test_manual_ack_acks_nothing_until_the_owner_does(nc: Client, topology: Topology) -> None:
    total = await fill_partition(nc, topology, 40)
    held: list[ConsumedMessage] = []

    async def keep(cm: ConsumedMessage) -> None:
        held.append(cm)

    consumer = await partition_consumer(nc, topology, 0, keep, MANUAL).start()
    try:
        await eventually(lambda: len(held) == total)
        await asyncio.sleep(0.3)  # any ack the consumer sent would have landed by now
        assert await unsettled(nc, topology, 0) == (0, total)
        assert not any(cm.resolved for cm in held)
        assert await ack_many(held[: total // 2]) == 0
        assert await ack_many(held) == 0  # the first half is skipped: settled already
        assert all(cm.resolved for cm in held)

        async def all_acked() -> bool:
            return await unsettled(nc, topology, 0) == (0, 0)

        async with asyncio.timeout(10):
            while not await all_acked():  # noqa: ASYNC110 - polling the server
                await asyncio.sleep(0.05)
        assert consumer.stats.handled == total
    finally:
        await consumer.stop()


async def test_batch_handler_keeps_order_and_bounds_batches(nc: Client, topology: Topology) -> None:
    total = await fill_partition(nc, topology, 60)
    batches: list[list[int]] = []

    async def take(batch: list[ConsumedMessage]) -> None:
        batches.append([cm.stream_seq for cm in batch])
        if len(batches) == 1:
            await asyncio.sleep(0.2)  # deliveries pile up meanwhile: the next batch is larger

    consumer = await partition_consumer(nc, topology, 0, settings=SMALL, batch_handler=take).start()
    try:
        await eventually(lambda: sum(map(len, batches)) == total)
        seqs = [seq for batch in batches for seq in batch]
        assert seqs == sorted(set(seqs))  # stream order, each message once
        assert all(1 <= len(batch) <= SMALL.batch for batch in batches)
        assert max(map(len, batches)) > 1
        assert consumer.stats.batches == len(batches)

        async def all_acked() -> bool:  # auto_ack: every returned batch was acked
            return await unsettled(nc, topology, 0) == (0, 0)

        async with asyncio.timeout(10):
            while not await all_acked():  # noqa: ASYNC110 - polling the server
                await asyncio.sleep(0.05)
    finally:
        await consumer.stop()


async def test_batch_outcomes_apply_to_the_messages_the_handler_left_unsettled(
    nc: Client, topology: Topology
) -> None:
    """Even seqs are acked by the handler itself; odd ones meet Retry on their first delivery
    and Reject later. Only the odd ones come back, and each is dead-lettered once."""
    total = await fill_partition(nc, topology, 24)
    seen: list[tuple[int, int]] = []  # (stream seq, delivery count)

    async def take(batch: list[ConsumedMessage]) -> None:
        seen.extend((cm.stream_seq, cm.num_delivered) for cm in batch)
        for cm in batch:
            if cm.stream_seq % 2 == 0:
                await cm.ack()
        if any(cm.num_delivered == 1 for cm in batch if cm.stream_seq % 2):
            raise Retry(delay_s=0.05)
        raise Reject("odd")

    consumer = await partition_consumer(nc, topology, 0, settings=SMALL, batch_handler=take).start()
    try:
        await eventually(lambda: len({seq for seq, _ in seen}) == total)
        seqs = sorted({seq for seq, _ in seen})
        odd = [seq for seq in seqs if seq % 2]
        await eventually(lambda: consumer.stats.rejected == len(odd))
        assert sorted(seq for seq, _ in seen if seq % 2 == 0) == [s for s in seqs if s % 2 == 0]
        assert {seq for seq, n in seen if n > 1} == set(odd)
        js = nc.jetstream()
        info = await js.stream_info(topology.dlq_stream)
        dead = [await js.get_msg(topology.dlq_stream, seq) for seq in range(1, len(odd) + 1)]
        assert info.state.messages == len(odd)
        assert sorted(int(d.headers["Tokenwire-Stream-Seq"]) for d in dead) == odd  # type: ignore[index]  # dead letters carry headers; a comprehension cannot narrow
        assert {d.headers["Tokenwire-Reason"] for d in dead} == {"odd"}  # type: ignore[index]  # dead letters carry headers; a comprehension cannot narrow

        async def all_settled() -> bool:
            return await unsettled(nc, topology, 0) == (0, 0)

        async with asyncio.timeout(10):
            while not await all_settled():  # noqa: ASYNC110 - polling the server
                await asyncio.sleep(0.05)
    finally:
        await consumer.stop()


async def test_concurrent_calls_overlap_and_each_message_meets_its_own_outcome(
    nc: Client, topology: Topology
) -> None:
    """``concurrent``: the calls for a delivery overlap (the first call waits while deliveries
    pile up; the calls of the next batch are all in flight at once, where one call at a time
    never has two); every third seq meets Retry on its first delivery and every fifth Reject;
    the rest are acked once each."""
    total = await fill_partition(nc, topology, 30)
    settings = dataclasses.replace(SMALL, concurrent=True)
    seen: list[tuple[int, int]] = []  # (stream seq, delivery count)
    in_flight, most = 0, 0

    async def handle(cm: ConsumedMessage) -> None:
        nonlocal in_flight, most
        seen.append((cm.stream_seq, cm.num_delivered))
        in_flight += 1
        most = max(most, in_flight)
        try:
            await asyncio.sleep(0.2 if len(seen) == 1 else 0.01)
        finally:
            in_flight -= 1
        if cm.stream_seq % 5 == 0:
            raise Reject("fifth")
        if cm.stream_seq % 3 == 0 and cm.num_delivered == 1:
            raise Retry(delay_s=0.05)

    consumer = await partition_consumer(nc, topology, 0, handle, settings).start()
    try:
        await eventually(lambda: len({seq for seq, _ in seen}) == total)
        seqs = sorted({seq for seq, _ in seen})
        fifth = [seq for seq in seqs if seq % 5 == 0]
        retried = [seq for seq in seqs if seq % 3 == 0 and seq % 5]
        await eventually(lambda: consumer.stats.rejected == len(fifth))
        await eventually(lambda: {seq for seq, n in seen if n > 1} == set(retried))
        assert most >= 3
        assert sorted(seq for seq, n in seen if n == 1) == seqs  # each delivered once first
        await settles_to(nc, topology, 0, (0, 0))
        assert consumer.stats.handled == total - len(fifth)
        assert sorted(Counter(seq for seq, _ in seen).items()) == sorted(
            (seq, 2 if seq in retried else 1) for seq in seqs
        )
    finally:
        await consumer.stop()


def test_exactly_one_handler_is_required(nc: Client) -> None:
    async def one(cm: ConsumedMessage) -> None: ...

    async def many(batch: list[ConsumedMessage]) -> None: ...

    with pytest.raises(ValueError, match="exactly one"):
        PullConsumer(nc, "S", "c")
    with pytest.raises(ValueError, match="exactly one"):
        PullConsumer(nc, "S", "c", one, batch_handler=many)


@pytest.mark.parametrize(
    "reply",
    [
        "$JS.ACK.TOKENWIRE.assembler-p3.2.1234.77.1700000000000000000.5",
        "$JS.ACK.hub.ACCHASH.TOKENWIRE.assembler-p3.2.1234.77.1700000000000000000.5.rnd",
        "$JS.ACK.hub.ACCHASH.TOKENWIRE.assembler-p3.1.9.9.1700000000000000000.0",
    ],
)
def test_ack_fields_agree_with_nats_py(reply: str) -> None:
    meta = Msg(_client=None, reply=reply).metadata  # type: ignore[arg-type]  # a Msg with no client, only its reply subject parsed
    assert ack_fields(reply) == (meta.sequence.stream, meta.num_delivered)
    # No client: parsing the reply subject needs none (the ignore: Msg and ConsumedMessage
    # type their client as Client).
    delivered = ConsumedMessage.of(Msg(_client=None, reply=reply), None, None)  # type: ignore[arg-type]  # a Msg with no client, only its reply subject parsed
    assert delivered.consumer_seq == meta.sequence.consumer


def test_ack_fields_reject_a_plain_reply_subject() -> None:
    seed = random.randrange(10**6)
    with pytest.raises(NotJSMessageError):
        ack_fields(f"_INBOX.{seed}")


@pytest.mark.slow
async def test_a_long_handler_call_keeps_the_pin(nc: Client, nats_url: str) -> None:
    """While the owner's handler holds a batch for 3 s (3x the priority timeout), keep-alive
    pulls keep the partition pinned to it: the standby receives nothing."""
    t = fresh_topology(partitions=1)
    await ensure_topology(nc, t, ack_wait_s=30.0, priority_timeout_s=1.0)
    await fill_partition(nc, t, 20)
    owner_got: list[int] = []
    standby_got: list[int] = []

    async def slow(batch: list[ConsumedMessage]) -> None:
        owner_got.extend(cm.stream_seq for cm in batch)
        if len(owner_got) == len(batch):
            await asyncio.sleep(3.0)

    async def fast(batch: list[ConsumedMessage]) -> None:
        standby_got.extend(cm.stream_seq for cm in batch)

    keepalive = dataclasses.replace(SMALL, pin_keepalive_s=0.3)
    owner = await partition_consumer(nc, t, 0, settings=keepalive, batch_handler=slow).start()
    nc_b = await connect(nats_url)
    standby: PullConsumer | None = None
    try:
        await eventually(lambda: bool(owner_got))
        standby = await partition_consumer(nc_b, t, 0, settings=SMALL, batch_handler=fast).start()
        await asyncio.sleep(3.5)
        assert standby_got == []
        assert owner.pinned
        await eventually(lambda: len(owner_got) == 20)
    finally:
        await owner.stop()
        if standby is not None:
            await standby.stop()
        await close_client(nc_b)
        await drop_topology(nc, t)
