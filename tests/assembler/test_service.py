"""The service against real parts: a real nats-server and both real databases."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

import httpx
import pytest
from nats.aio.client import Client

from tests.assembler.harness import (
    Plan,
    check_store,
    eventually,
    make_plan,
    publish_one,
    publish_plan,
    settings_for,
)
from tests.assembler.scripts import text_step, tools_step
from tests.fixtures.broker import provisioned
from tests.fixtures.stores import DelegatingStore
from tokenwire.broker import ChunkPublisher, Topology, chunk_subject, connect, consumer_state
from tokenwire.schemas import (
    ChunkEnvelope,
    ErrorEvent,
    MessageEvent,
    StepPersisted,
    TextDelta,
    json_encoder,
)
from tokenwire.services.assembler import Assembler, AssemblerLoopError, ProbeServer, run
from tokenwire.services.assembler._metrics import probe_app
from tokenwire.store import CommittedStep, StepRecord, Store, StoreUnavailable, open_store


@pytest.fixture
async def fast_topology(nc: Client) -> AsyncIterator[Topology]:
    """A topology whose consumers redeliver after 1 s and move the pin after 1 s."""
    async with provisioned(nc, ack_wait_s=1.0, priority_timeout_s=1.0) as t:
        yield t


async def ack_pending(nc: Client, t: Topology) -> tuple[int, int]:
    states = [
        await consumer_state(nc, t.stream, t.assembler_consumer(p)) for p in range(t.partitions)
    ]
    assert all(s is not None for s in states)
    return sum(s.num_pending for s in states), sum(s.num_ack_pending for s in states)


async def test_burst_persists_every_step_once_with_contiguous_seqs(
    nc: Client, nats_url: str, topology: Topology, db_url: str, db: Store
) -> None:
    plan = make_plan(seed=11, sessions=8, turns=3)
    await publish_plan(nc, topology, plan, seed=11)
    assembler = await run(settings_for(nats_url, topology, db_url))
    await check_store(db, plan)
    assert await ack_pending(nc, topology) == (0, 0)
    m = assembler.metrics
    assert m.chunks._value.get() == plan.chunk_count
    assert sum(s._value.get() for s in m.steps._metrics.values()) == 24  # type: ignore[attr-defined]  # prometheus_client: _metrics has an unbound TypeVar


async def test_duplicate_publishes_and_a_second_run_leave_the_store_unchanged(
    nc: Client, nats_url: str, topology: Topology, db_url: str, db: Store
) -> None:
    plan = make_plan(seed=12, sessions=4, turns=2)
    await publish_plan(nc, topology, plan, seed=12)
    js = nc.jetstream()
    # the same chunks again under new Msg-Ids (a publisher that lost its dedupe ids)
    for steps in plan.steps.values():
        for *_, envs in steps[:1]:
            for env in envs:
                subject = chunk_subject(topology, env.session, env.ordinal == 0)
                headers = {"Nats-Msg-Id": f"again:{env.session}:{env.turn}:{env.ordinal}"}
                await js.publish(subject, json_encoder.encode(env), headers=headers)
    settings = settings_for(nats_url, topology, db_url)
    await run(settings)
    await check_store(db, plan)
    # a whole replay of the partitions by a new durable run changes nothing either
    for steps in plan.steps.values():
        for *_, envs in steps:
            for env in envs[:2]:
                subject = chunk_subject(topology, env.session, env.ordinal == 0)
                headers = {"Nats-Msg-Id": f"third:{env.session}:{env.turn}:{env.ordinal}"}
                await js.publish(subject, json_encoder.encode(env), headers=headers)
    # partial copies open steps that never complete: they close as abandoned, and the
    # idempotent commit leaves the store as it was
    from tokenwire.services.assembler import AssemblyConfig

    stop = asyncio.Event()
    quick = settings_for(
        nats_url, topology, db_url, burst=False, assembly=AssemblyConfig(abandon_timeout_s=0.3)
    )
    task = asyncio.create_task(run(quick, stop))

    async def settled() -> bool:
        return await ack_pending(nc, topology) == (0, 0)

    await eventually(settled, what="every copy acknowledged")
    stop.set()
    second = await asyncio.wait_for(task, 20)
    await check_store(db, plan)
    assert second.metrics.duplicates.labels("store")._value.get() > 0


class CrashAfterCommit(BaseException):
    """Kills the commit task after the store committed, before any acknowledgement."""


class CrashingStore(DelegatingStore):
    """Delegates to a real store; the first commit commits, then the task dies."""

    def __init__(self, real: Store) -> None:
        super().__init__(real)
        self.crashed = asyncio.Event()

    async def commit(self, records: Sequence[StepRecord]) -> list[CommittedStep]:
        results = await self.real.commit(records)
        if not self.crashed.is_set():
            self.crashed.set()
            raise CrashAfterCommit
        return results


async def test_kill_after_commit_before_ack_then_a_new_owner_changes_nothing(
    nc: Client, nats_url: str, fast_topology: Topology, db_url: str, db: Store
) -> None:
    t = fast_topology
    plan = make_plan(seed=13, sessions=6, turns=2)
    await publish_plan(nc, t, plan, seed=13)
    nc1 = await connect(nats_url, name="doomed")
    crashing = CrashingStore(db)
    doomed = Assembler(settings_for(nats_url, t, db_url, burst=False), nc1, crashing)
    await doomed.start()
    await asyncio.wait_for(crashing.crashed.wait(), 20)
    # the instance dies: no ack, no nak, no unpin
    for consumer in doomed.partitions.consumers.values():
        for task in consumer._tasks:
            task.cancel()
    for task in doomed._tasks:
        task.cancel()
    await asyncio.sleep(0)
    with contextlib.suppress(OSError):
        await nc1.close()
    pending, unacked = await ack_pending(nc, t)
    assert pending + unacked > 0
    await run(settings_for(nats_url, t, db_url))
    await check_store(db, plan)
    assert await ack_pending(nc, t) == (0, 0)


async def test_poison_goes_to_the_dead_letter_stream_and_the_rest_continues(
    nc: Client, nats_url: str, topology: Topology, db_url: str, db: Store
) -> None:
    plan = Plan()
    good = plan.add("ok1", 0, 0, text_step(["a", "b"]))
    tools = plan.add("ok2", 0, 0, tools_step("Oslo"))
    js = nc.jetstream()
    publisher = await ChunkPublisher(nc, topology).start()
    for env in good:
        await publish_one(publisher, env)
    await publisher.flush(5)
    await js.publish(
        chunk_subject(topology, "ok1", False), b"{not json", headers={"Nats-Msg-Id": "junk"}
    )
    beyond = ChunkEnvelope(
        "ok1", 0, 0, len(good), 1, "scripted", "m-1", TextDelta(index=0, text="!")
    )
    await js.publish(chunk_subject(topology, "ok1", False), json_encoder.encode(beyond))
    for env in tools:
        await publish_one(publisher, env)
    await publisher.close()
    assembler = await run(settings_for(nats_url, topology, db_url))
    await check_store(db, plan)
    assert await ack_pending(nc, topology) == (0, 0)
    dead = [await js.get_msg(topology.dlq_stream, seq=i) for i in (1, 2)]
    assert [d.subject for d in dead] == [topology.dlq_subject("assembler")] * 2
    reasons = sorted(d.headers["Tokenwire-Reason"] for d in dead)  # type: ignore[index]  # dead letters carry headers
    assert reasons == ["beyond-finish", "undecodable"]
    assert {d.data for d in dead} == {b"{not json", json_encoder.encode(beyond)}
    for d in dead:
        assert d.headers is not None
        assert d.headers["Tokenwire-Subject"].startswith(f"{topology.prefix}.chunks.")
        assert int(d.headers["Tokenwire-Stream-Seq"]) > 0
    assert assembler.metrics.dead_lettered.labels("undecodable")._value.get() == 1


class BrokenStore(DelegatingStore):
    """A real store whose commits fail with an error no retry expects (a bug's)."""

    async def commit(self, records: Sequence[StepRecord]) -> list[CommittedStep]:
        raise RuntimeError("a bug in the store's commit")

    async def close(self) -> None:
        pass


async def test_a_dead_commit_loop_stops_the_instance_with_the_reason(
    nc: Client, nats_url: str, topology: Topology, db_url: str, db: Store
) -> None:
    """A background loop that ends stops the service with an error (a supervisor restarts
    it, the operator reads why) instead of leaving it running, and ready, storing nothing."""
    plan = make_plan(seed=15, sessions=2, turns=1)
    await publish_plan(nc, topology, plan, seed=15)
    stop = asyncio.Event()
    settings = settings_for(nats_url, topology, db_url, burst=False)
    with pytest.raises(AssemblerLoopError) as raised:
        await asyncio.wait_for(run(settings, stop, store=BrokenStore(db)), 60)
    assert not stop.is_set()
    assert raised.value.loop == "commit"
    assert "a bug in the store's commit" in str(raised.value)
    assert isinstance(raised.value.__cause__, RuntimeError)
    session, steps = next(iter(plan.steps.items()))
    assert await db.step_outcome(session, steps[0][0], steps[0][1]) is None  # nothing stored


class FlakyStore(DelegatingStore):
    """A real store behind a switch: while ``down`` is set every commit and outcome read
    raises StoreUnavailable (or is sent to ``outage``, a store on a closed port, for
    PostgreSQL)."""

    def __init__(self, real: Store, outage: Store | None) -> None:
        super().__init__(real)
        self.outage = outage
        self.down = True
        self.failures = 0

    def _target(self) -> Store:
        if not self.down:
            return self.real
        self.failures += 1
        if self.outage is None:
            raise StoreUnavailable("sqlite", "simulated outage")
        return self.outage

    async def commit(self, records: Sequence[StepRecord]) -> list[CommittedStep]:
        return await self._target().commit(records)

    async def step_outcome(
        self, session: str, turn: int, step: int
    ) -> MessageEvent | ErrorEvent | None:
        return await self._target().step_outcome(session, turn, step)

    async def ping(self) -> None:
        await self.real.ping()

    async def close(self) -> None:
        pass


async def test_store_outage_loses_nothing_and_drains_when_it_returns(
    nc: Client, nats_url: str, topology: Topology, db_url: str, db: Store
) -> None:
    outage = None
    if db_url.startswith("postgresql"):
        from tokenwire.broker import free_port

        outage = open_store(f"postgresql://postgres@127.0.0.1:{free_port()}/test?connect_timeout=1")
    flaky = FlakyStore(db, outage)
    plan = make_plan(seed=14, sessions=5, turns=2)
    await publish_plan(nc, topology, plan, seed=14)
    stop = asyncio.Event()
    task = asyncio.create_task(
        run(settings_for(nats_url, topology, db_url, burst=False), stop, store=flaky)
    )
    try:
        await eventually(lambda: _true(flaky.failures >= 3), what="failed commits")
        await asyncio.sleep(0.3)
        assert await db.messages("s0") == []
        assert (await ack_pending(nc, topology))[1] == plan.chunk_count  # nothing acked
        flaky.down = False

        async def settled() -> bool:
            return await ack_pending(nc, topology) == (0, 0)

        await eventually(settled, what="the backlog to drain")
        await check_store(db, plan)
    finally:
        stop.set()
        assembler = await asyncio.wait_for(task, 20)
        if outage is not None:
            await outage.close()
    assert assembler.metrics.store_failures.labels("unavailable")._value.get() >= 3


async def _true(value: bool) -> bool:
    return value


async def test_step_persisted_arrives_after_the_commit(
    nc: Client, nats_url: str, topology: Topology, db_url: str, db: Store
) -> None:
    plan = make_plan(seed=15, sessions=3, turns=2)
    seen: list[tuple[StepPersisted, bool]] = []
    import msgspec

    decoder = msgspec.json.Decoder(StepPersisted)

    async def on_event(msg) -> None:
        event = decoder.decode(msg.data)
        stored = await db.step_outcome(event.session, event.turn, event.step)
        ok = stored is not None and (stored.seq_start, stored.seq_end) == (
            event.seq_start,
            event.seq_end,
        )
        seen.append((event, ok))

    sub = await nc.subscribe(f"{topology.prefix}.events.*.*.persisted", cb=on_event)
    await publish_plan(nc, topology, plan, seed=15)
    await run(settings_for(nats_url, topology, db_url))
    await eventually(lambda: _true(len(seen) >= 6), what="six events")
    await sub.unsubscribe()
    assert all(ok for _, ok in seen)
    keys = sorted((e.session, e.turn) for e, _ in seen)
    assert keys == sorted((s, t) for s, steps in plan.steps.items() for t, *_ in steps)
    # and the events stream kept them, once each
    info = await nc.jetstream().stream_info(topology.events_stream)
    assert info.state.messages == 6


async def test_metrics_and_probes_over_http(
    nc: Client, nats_url: str, topology: Topology, sqlite_url: str
) -> None:
    store = open_store(sqlite_url)
    plan = make_plan(seed=16, sessions=2, turns=1)
    await publish_plan(nc, topology, plan)
    nc1 = await connect(nats_url)
    assembler = Assembler(settings_for(nats_url, topology, sqlite_url, burst=False), nc1, store)
    server = ProbeServer("127.0.0.1", 0, probe_app(assembler.metrics.registry, assembler.probe))
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as client:
            not_yet = await client.get("/readyz")
            assert (not_yet.status_code, not_yet.text) == (503, "not ready: not started\n")
            await assembler.start()
            assert (await client.get("/healthz")).status_code == 200

            async def ready() -> bool:  # once it holds the partitions the two steps are on
                return (await client.get("/readyz")).status_code == 200

            await eventually(ready, what="ready")
            answer = (await client.get("/readyz")).text
            assert answer.startswith("ready: owns ")
            assert answer.endswith(" of 4 partitions\n")

            async def committed() -> bool:
                complete: float = assembler.metrics.steps.labels("complete")._value.get()
                return complete == 2

            await eventually(committed, what="two steps")
            await assembler.poll_lag()
            body = (await client.get("/metrics")).text
        assert "tokenwire_assembler_chunks_total" in body
        assert 'tokenwire_assembler_steps_total{reason="complete"} 2.0' in body
        assert "tokenwire_assembler_commit_seconds_bucket" in body
        assert 'tokenwire_assembler_lag_messages{partition="0"} 0.0' in body
        assert "tokenwire_assembler_owned_partitions" in body
        assert 'tokenwire_assembler_lag_seconds{partition="0"} 0.0' in body
        assert "tokenwire_assembler_ready 1.0" in body
        assert 'tokenwire_assembler_not_ready{reason="unowned"} 0.0' in body
    finally:
        await assembler.close()
        server.close()
        await nc1.close()
        await store.close()
