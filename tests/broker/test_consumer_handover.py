"""PullConsumer hand-over (ADR 0016): pause, release the pin, stay out unless offering.

Against the real server: the released partition goes to the standby that offers, the one
that stays out (``offering = False``) gets nothing, and no message is lost or handled twice.
"""

from __future__ import annotations

import pytest
from nats.aio.client import Client

from tests.broker.test_consumer import eventually
from tests.fixtures.broker import close_client
from tokenwire.broker import (
    ChunkPublisher,
    ConsumedMessage,
    PullSettings,
    Topology,
    connect,
    consumer_state,
    partition_consumer,
    partition_of,
)

SETTINGS = PullSettings(batch=8, expires_s=2.0, standby_expires_s=1.0, pin_keepalive_s=0.5)


async def publish(nc: Client, t: Topology, first_ordinal: int, count: int) -> None:
    """``count`` chunks of one session of partition 0."""
    session = next(s for s in (f"h{i}" for i in range(1000)) if partition_of(s, t.partitions) == 0)
    publisher = await ChunkPublisher(nc, t).start()
    for k in range(first_ordinal, first_ordinal + count):
        await publisher.publish(b"c", session, 0, 0, k, first=k == 0)
    await publisher.flush(10)
    await publisher.close()


@pytest.mark.parametrize("stays_out", [False, True])
async def test_a_released_partition_goes_to_an_offering_standby_only(
    nc: Client, nats_url: str, topology: Topology, stays_out: bool
) -> None:
    got: dict[str, list[int]] = {"a": [], "b": [], "c": []}

    def record(name: str):
        async def handle(cm: ConsumedMessage) -> None:
            got[name].append(cm.stream_seq)

        return handle

    clients = [await connect(nats_url) for _ in range(3)]
    a, b, c = (
        partition_consumer(cl, topology, 0, record(n), SETTINGS)
        for cl, n in zip(clients, "abc", strict=True)
    )
    try:
        await a.start()
        await publish(nc, topology, 0, 10)
        await eventually(lambda: len(got["a"]) == 10)
        b.offering = not stays_out  # b: at its share (stays out) or below it (offers)
        c.offering = False
        await b.start()
        await c.start()
        assert await a.pause()
        released = await a.release()
        assert released is not None
        assert a.pin_id is None
        a.offering = False
        a.resume()
        await publish(nc, topology, 10, 10)
        if stays_out:  # nobody offers: the partition waits, unpinned, nothing is lost
            await eventually(lambda: not a.pinned and not b.pinned and not c.pinned, 5)
            assert got["b"] == got["c"] == []
            assert len(got["a"]) == 10
            b.offering = True
        await eventually(lambda: len(got["b"]) == 10)
        assert got["c"] == []
        assert len(got["a"]) == 10
        assert sorted(got["a"] + got["b"]) == list(range(1, 21))
        assert b.pin_id is not None
        assert b.pin_id != released
    finally:
        for consumer in (a, b, c):
            await consumer.stop()
        for client in clients:
            await close_client(client)


async def test_a_pin_won_by_a_standby_pull_sent_before_the_offer_ended_is_declined(
    nc: Client, nats_url: str, topology: Topology
) -> None:
    """The first delivery pins a partition to the oldest standby pull; a client that stopped
    offering while its pull was still open hands the message and the pin back, so the client
    that offers now gets the partition (ADR 0026), and nothing is lost or handled twice."""
    got: dict[str, list[int]] = {"a": [], "b": []}

    def record(name: str):
        async def handle(cm: ConsumedMessage) -> None:
            got[name].append(cm.stream_seq)

        return handle

    # a's standby pull outlives the test (30 s), so it is still open, and first in the
    # server's queue, when the first message arrives.
    lingering = PullSettings(batch=8, expires_s=2.0, standby_expires_s=30.0, pin_keepalive_s=0.5)
    clients = [await connect(nats_url) for _ in range(2)]
    a = partition_consumer(clients[0], topology, 0, record("a"), lingering)
    b = partition_consumer(clients[1], topology, 0, record("b"), SETTINGS)
    try:
        await a.start()
        await eventually(lambda: a.stats.pulls == 1)
        await clients[0].flush()  # the server has a's standby pull before b's
        await b.start()
        await eventually(lambda: b.stats.pulls >= 1)
        await clients[1].flush()
        a.offering = False  # the allotment moved on; a's pull is still open at the server
        await publish(nc, topology, 0, 10)
        await eventually(lambda: len(got["b"]) == 10)
        assert got["a"] == []
        assert sorted(got["b"]) == list(range(1, 11))
        assert a.stats.declined == 1
        assert a.pin_id is None
        assert b.pin_id is not None
        state = await consumer_state(nc, topology.stream, topology.assembler_consumer(0))
        assert state.pinned(topology.assembler_group) == b.pin_id
    finally:
        for consumer in (a, b):
            await consumer.stop()
        for client in clients:
            await close_client(client)
