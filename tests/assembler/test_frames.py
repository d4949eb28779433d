"""The assembler on frames (schema version 2, ADR 0024), against a real nats-server and both
real databases: a frame is acked after its step's commit, and redelivery, a crash between
commit and ack, and copies of frames under new Msg-Ids leave the store exactly as the plan."""

from __future__ import annotations

import asyncio
import contextlib

from nats.aio.client import Client

from tests.assembler.harness import Plan, check_store, make_plan, publish_plan, settings_for
from tests.assembler.scripts import text_step
from tests.assembler.test_service import CrashingStore, ack_pending
from tests.fixtures.frames import frame_of, framed
from tokenwire.broker import ChunkPublisher, Topology, chunk_subject, connect
from tokenwire.schemas import ChunkEnvelope, TextDelta
from tokenwire.services.assembler import Assembler, run
from tokenwire.store import Store


async def test_frames_are_assembled_once_and_acked_after_the_commit(
    nc: Client, nats_url: str, topology: Topology, db_url: str, db: Store
) -> None:
    plan = make_plan(seed=21, sessions=8, turns=3)
    await publish_plan(nc, topology, plan, seed=21, frame_size=5)
    assembler = await run(settings_for(nats_url, topology, db_url))
    await check_store(db, plan)
    assert await ack_pending(nc, topology) == (0, 0)
    assert assembler.metrics.chunks._value.get() == plan.chunk_count  # chunks, not messages


async def test_copies_of_frames_under_new_msg_ids_change_nothing(
    nc: Client, nats_url: str, topology: Topology, db_url: str, db: Store
) -> None:
    plan = make_plan(seed=22, sessions=4, turns=2)
    await publish_plan(nc, topology, plan, seed=22, frame_size=4)
    js = nc.jetstream()
    for steps in plan.steps.values():  # the first step of each session again, other frames
        for *_, envs in steps[:1]:
            for n, (env, payload) in enumerate(framed(envs, 3)):
                subject = chunk_subject(topology, env.session, env.ordinal == 0)
                await js.publish(subject, payload, headers={"Nats-Msg-Id": f"again:{n}:{env}"})
    await run(settings_for(nats_url, topology, db_url))
    await check_store(db, plan)
    assert await ack_pending(nc, topology) == (0, 0)


async def test_a_crash_between_commit_and_ack_redelivers_frames_without_a_change(
    nc: Client, nats_url: str, db_url: str, db: Store
) -> None:
    from tests.fixtures.broker import provisioned

    async with provisioned(nc, ack_wait_s=1.0, priority_timeout_s=1.0) as t:
        plan = make_plan(seed=23, sessions=6, turns=2)
        await publish_plan(nc, t, plan, seed=23, frame_size=6)
        nc1 = await connect(nats_url, name="doomed")
        crashing = CrashingStore(db)
        doomed = Assembler(settings_for(nats_url, t, db_url, burst=False), nc1, crashing)
        await doomed.start()
        await asyncio.wait_for(crashing.crashed.wait(), 20)
        for consumer in doomed.partitions.consumers.values():  # dies: no ack, nak or unpin
            for task in consumer._tasks:
                task.cancel()
        for task in doomed._tasks:
            task.cancel()
        await asyncio.sleep(0)
        with contextlib.suppress(OSError):
            await nc1.close()
        assert sum(await ack_pending(nc, t)) > 0
        await run(settings_for(nats_url, t, db_url))
        await check_store(db, plan)
        assert await ack_pending(nc, t) == (0, 0)


async def test_a_frame_with_a_chunk_past_the_finish_is_copied_to_the_dlq_and_acked(
    nc: Client, nats_url: str, topology: Topology, db_url: str, db: Store
) -> None:
    """The step keeps its chunks up to the finish; the frame (whose other chunks were taken)
    is copied to the dead-letter stream and settled with the step, never terminated."""
    plan = Plan()
    envs = plan.add("mixed", 0, 0, text_step(["a", "b", "c"]))
    beyond = ChunkEnvelope(
        "mixed", 0, 0, len(envs), envs[-1].time_ns + 1, "scripted", "m-1", TextDelta(0, "!")
    )
    publisher = await ChunkPublisher(nc, topology).start()
    try:
        first, rest = envs[:1], [*envs[1:], beyond]
        for part in (first, rest):
            env = part[0]
            await publisher.publish(
                frame_of(part), env.session, env.turn, env.step, env.ordinal, first=env.ordinal == 0
            )
        await publisher.flush(5)
    finally:
        await publisher.close()
    assembler = await run(settings_for(nats_url, topology, db_url))
    await check_store(db, plan)
    assert await ack_pending(nc, topology) == (0, 0)
    dead = await nc.jetstream().get_msg(topology.dlq_stream, seq=1)
    assert dead.headers is not None
    assert dead.headers["Tokenwire-Reason"] == "beyond-finish"
    assert dead.data == frame_of(rest)
    assert assembler.metrics.dead_lettered.labels("beyond-finish")._value.get() == 1
