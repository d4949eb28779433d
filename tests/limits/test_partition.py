"""A long step cannot starve its partition (issue 12, part 2).

The assembler holds a step's chunks unacknowledged until the step commits, so the chunks of
open steps count against the partition consumer's ``max_ack_pending``; at that bound the broker
delivers nothing more on the partition. Before the chunk bound an endless step filled it and
every other session of the partition waited behind it (the issue saw 562,902 chunks held).
Here one partition, a consumer with ``max_ack_pending`` 1,000 (the production ratio scaled
down: 200,000), two endless steps and ``max_step_chunks`` 400: the long steps end as recorded
limits, and the short sessions of the same partition keep committing meanwhile and after.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import pytest
from nats.aio.client import Client

from tests.assembler.harness import eventually, settings_for
from tests.fixtures.broker import drop_topology, fresh_topology
from tests.limits.rig import limit_rig, stream_text
from tokenwire.broker import ensure_topology
from tokenwire.broker._provision import assembler_consumer_config, ensure_consumer
from tokenwire.schemas import ErrorEvent, MessageEvent
from tokenwire.services.assembler import run as run_assembler
from tokenwire.store import open_store

pytestmark = pytest.mark.slow
MAX_ACK_PENDING = 1000


async def test_other_sessions_keep_committing_beside_endless_steps(
    nc: Client, nats_url: str, sqlite_url: str
) -> None:
    topology = fresh_topology(partitions=1)
    await ensure_topology(nc, topology)
    config = assembler_consumer_config(topology, 0, 30.0, 10, 5.0)
    await ensure_consumer(nc, topology.stream, {**config, "max_ack_pending": MAX_ACK_PENDING})
    stop = asyncio.Event()
    settings = replace(settings_for(nats_url, topology, sqlite_url), burst=False)
    assembler = asyncio.create_task(run_assembler(settings, stop))
    store = open_store(sqlite_url)
    try:
        async with limit_rig(nc, topology, nats_url, sqlite_url, max_step_chunks=400) as rig:
            long_ids = [f"long-{i}-{uuid.uuid4().hex[:6]}" for i in range(2)]
            longs = [
                asyncio.create_task(stream_text(rig.openai(s), "endless:10")) for s in long_ids
            ]

            async def outcome(session: str) -> bool:
                events = await store.session_events(session)
                return any(isinstance(e, MessageEvent | ErrorEvent) for e in events)

            committed_beside, shorts = 0, 0
            while not all(t.done() for t in longs) or shorts < 3:
                sid = f"short-{shorts}-{uuid.uuid4().hex[:6]}"
                assert (await stream_text(rig.openai(sid), "big-text:40"))[2] == "stop"
                await eventually(lambda sid=sid: outcome(sid), 20, f"{sid} to commit")
                committed_beside += not all(t.done() for t in longs)
                shorts += 1
            endings = [(await t)[2] for t in longs]
            assert all("max_step_chunks" in e for e in endings), endings
            for sid in long_ids:
                await eventually(lambda sid=sid: outcome(sid), 20, f"{sid} to be recorded")
                events = await store.session_events(sid)
                errors = [e.error.kind for e in events if isinstance(e, ErrorEvent)]
                assert errors == ["limit"]
            assert committed_beside >= 1, "no short session committed while the long ran"
    finally:
        stop.set()
        await asyncio.wait_for(assembler, 30)
        await store.close()
        await drop_topology(nc, topology)
