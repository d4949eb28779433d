"""Changing the partition count of a live deployment (docs/operations.md "Adding partitions"):
drain, re-provision with the new count, resume. Sessions that continue across the switch end
in the store exactly as scripted: nothing missing or doubled, sequences contiguous from 1.
"""

from __future__ import annotations

import dataclasses

from nats.aio.client import Client

from tests.assembler.harness import Plan, check_store, make_plan, publish_plan, settings_for
from tests.assembler.test_service import ack_pending
from tokenwire.broker import Topology, consumer_state, ensure_topology, partition_of
from tokenwire.services.assembler import run
from tokenwire.store import Store


def turns(plan: Plan, wanted: range) -> Plan:
    part = Plan()
    for session, steps in plan.steps.items():
        part.steps[session] = [s for s in steps if s[0] in wanted]
    return part


async def test_growing_four_to_eight_partitions_loses_and_doubles_nothing(
    nc: Client, nats_url: str, topology: Topology, db_url: str, db: Store
) -> None:
    plan = make_plan(seed=44, sessions=24, turns=4)
    moved = [s for s in plan.steps if partition_of(s, 4) != partition_of(s, 8)]
    assert moved, "no session changes partition: the test would prove nothing"
    # Before: two turns per session on 4 partitions, assembled; the drain is the burst run
    # returning with every partition consumer fully acknowledged.
    await publish_plan(nc, topology, turns(plan, range(2)), seed=1)
    await run(settings_for(nats_url, topology, db_url))
    assert await ack_pending(nc, topology) == (0, 0)
    # Switch: the same names, 8 partitions (the transform is updated, p4..p7 created).
    grown = dataclasses.replace(topology, partitions=8)
    await ensure_topology(nc, grown, ack_wait_s=30.0, priority_timeout_s=2.0)
    # After: the same sessions' next two turns, filed by the new function.
    await publish_plan(nc, grown, turns(plan, range(2, 4)), seed=2)
    await run(settings_for(nats_url, grown, db_url))
    assert await ack_pending(nc, grown) == (0, 0)
    await check_store(db, plan)
    stats = await db.stats()
    assert (stats.steps, stats.chunks) == (24 * 4, plan.chunk_count)
    new_partitions = {partition_of(s, 8) for s in moved} - set(range(4))
    for p in new_partitions:  # the moved sessions' later chunks went through the new consumers
        state = await consumer_state(nc, grown.stream, grown.assembler_consumer(p))
        assert state is not None
        assert state.ack_floor.stream_seq > 0, p
