"""Ordered reads by name: every create (and every recreate after a gap) is a fresh name."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from nats.js.api import ConsumerConfig

from tokenwire.broker import Topology, chunk_subject, ordered_subscribe
from tokenwire.broker._ordered import READER_NAME_PREFIX


async def test_a_reset_recreates_the_consumer_under_a_new_name(
    nc: Client, topology: Topology
) -> None:
    js = nc.jetstream()
    subject = chunk_subject(topology, "sess-o", first=False)
    for i in range(6):
        await js.publish(subject, f"m{i}".encode(), stream=topology.stream)
    sub = await ordered_subscribe(
        js, topology.session_filter("sess-o"), stream=topology.stream, config=ConsumerConfig()
    )
    try:
        first = (await sub.consumer_info()).name
        assert first.startswith(READER_NAME_PREFIX)
        assert [(await sub.next_msg(timeout=5)).data for _ in range(2)] == [b"m0", b"m1"]
        # What nats-py does on a gap: recreate from the next expected sequence.
        jsi = sub._sub._jsi
        assert jsi is not None
        assert await jsi.reset_ordered_consumer(4)
        for _ in range(100):  # the recreate runs in a task of nats-py's; bounded wait
            if sub._consumer != first:
                break
            await asyncio.sleep(0.05)
        second = sub._consumer
        assert second != first
        assert second.startswith(READER_NAME_PREFIX)
        info = await js.consumer_info(topology.stream, second)
        assert info.config.opt_start_seq == 4
    finally:
        await sub.unsubscribe()
