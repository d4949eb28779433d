"""The telemetry consumer against a real nats-server: deliveries equal steps, not tokens."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import msgspec
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from tests.fixtures.broker import provisioned
from tokenwire.broker import (
    ChunkPublisher,
    ConsumedMessage,
    Topology,
    chunk_subject,
    ensure_topology,
    publish_event,
)
from tokenwire.schemas import (
    ChunkEnvelope,
    Finish,
    StreamChunk,
    StreamStarted,
    TextDelta,
    json_encoder,
)
from tokenwire.services.telemetry import TelemetryConsumer, TelemetryMetrics

SENTINEL = "SENTINEL-c0ffee"
SEED = 20261129


@pytest.fixture(params=[1, 3], ids=["R1", "R3"])
async def topology(nc: Client, request: pytest.FixtureRequest) -> AsyncIterator[Topology]:
    """Every case with the events in one stream (R = 1) and in three (R = 3)."""
    async with provisioned(nc, registry_shards=request.param) as t:
        yield t


def _chunks(n: int) -> list[StreamChunk]:
    texts: list[StreamChunk] = [TextDelta(index=0, text=f"{SENTINEL} {i}") for i in range(n - 1)]
    return [*texts, Finish(reason="stop")]


async def _publish_steps(
    nc: Client, topology: Topology, lengths: list[int]
) -> list[tuple[str, int, int]]:
    publisher = await ChunkPublisher(nc, topology).start()
    steps = []
    for k, n in enumerate(lengths):
        session, turn, step = f"sess-{k % 37}", k // 37, k % 3
        for ordinal, chunk in enumerate(_chunks(n)):
            env = ChunkEnvelope(
                session=session,
                turn=turn,
                step=step,
                ordinal=ordinal,
                time_ns=2_000_000 + ordinal,
                provider="scripted",
                model=f"m-{k % 2}",
                chunk=chunk,
                request_time_ns=1_000_000 if ordinal == 0 else None,
            )
            await publisher.publish(
                json_encoder.encode(env), session, turn, step, ordinal, first=ordinal == 0
            )
        steps.append((session, turn, step))
    await publisher.flush(30)
    await publisher.close()
    return steps


async def _signals(nc: Client, topology: Topology) -> list[StreamStarted]:
    """Every started signal, from every events stream (each holds its own sessions only)."""
    out: list[StreamStarted] = []
    for stream in topology.events_streams:
        for msg in await _stored(nc, stream, topology.events_filter("started")):
            assert SENTINEL.encode() not in msg.data
            signal = msgspec.json.decode(msg.data, type=StreamStarted)
            assert topology.events_stream_of(signal.session) == stream
            out.append(signal)
    return out


async def _stored(nc: Client, stream: str, subject: str) -> list[Msg]:
    js = nc.jetstream()
    sub = await js.subscribe(subject, stream=stream, ordered_consumer=True)
    total = (await js.stream_info(stream)).state.messages
    out: list[Msg] = []
    try:
        while len(out) < total:
            out.append(await sub.next_msg(timeout=5))
    except TimeoutError:
        pass
    finally:
        await sub.unsubscribe()
    return out


def _delivered(consumer_info: object) -> int:
    return int(consumer_info.delivered.consumer_seq)  # type: ignore[attr-defined]  # nats-py's ConsumerInfo types delivered as Optional


@pytest.mark.slow
async def test_two_hundred_steps_give_two_hundred_deliveries_and_signals(
    nc: Client, topology: Topology
) -> None:
    rng = random.Random(SEED)
    print(f"seed={SEED}")
    lengths = [1, 2000] + [rng.randint(1, 2000) for _ in range(198)]
    steps = await _publish_steps(nc, topology, lengths)
    metrics = TelemetryMetrics()
    deliveries: list[int] = []  # each handled delivery's num_delivered

    class Counting(TelemetryConsumer):
        async def handle(self, msg: ConsumedMessage) -> None:
            deliveries.append(msg.num_delivered)
            await super().handle(msg)

    consumer = Counting(nc=nc, topology=topology, metrics=metrics)

    await asyncio.wait_for(consumer.run(asyncio.Event(), burst=True), 60)

    info = await nc.jetstream().consumer_info(topology.stream, topology.telemetry_consumer)
    # 200 first deliveries: the consumer's filter takes each step's first chunk only. On a busy
    # machine a publish can time out and come back (at least once), so the broker's count is
    # checked against the deliveries handled, not against 200.
    assert deliveries.count(1) == 200
    assert _delivered(info) == len(deliveries)
    signals = await _signals(nc, topology)
    assert sorted((s.session, s.turn, s.step) for s in signals) == sorted(steps)
    assert all(s.time_to_first_chunk_s == pytest.approx(0.001) for s in signals)
    total = sum(
        metrics.registry.get_sample_value(
            "tokenwire_stream_starts_total", {"provider": "scripted", "model": m}
        )
        or 0
        for m in ("m-0", "m-1")
    )
    assert total == 200
    exposition = "\n".join(
        f"{s.name}{s.labels}" for metric in metrics.registry.collect() for s in metric.samples
    )
    assert SENTINEL not in exposition


async def test_a_restart_in_the_middle_sends_no_signal_twice(
    nc: Client, topology: Topology
) -> None:
    # A short ack_wait, so that the crashed instance's unacked message comes back quickly.
    await ensure_topology(nc, topology, ack_wait_s=2.0, priority_timeout_s=2.0)
    steps = await _publish_steps(nc, topology, [3] * 40)
    first = TelemetryMetrics()
    seen = 0
    crashed = asyncio.Event()

    class CrashAfter(TelemetryConsumer):
        async def handle(self, msg):
            nonlocal seen
            await super().handle(msg)
            seen += 1
            if seen == 20:
                # The signal went out but the process dies before its ack: the broker
                # redelivers this first chunk to the next instance.
                crashed.set()
                await asyncio.Event().wait()

    crashing = CrashAfter(nc=nc, topology=topology, metrics=first)
    pull = await crashing.consumer().start()
    await asyncio.wait_for(crashed.wait(), 30)
    await pull.stop(timeout_s=0.1, release=True)

    second = TelemetryMetrics()
    restarted = TelemetryConsumer(nc=nc, topology=topology, metrics=second)
    # The message the crashed instance was handling is redelivered after ack_wait (2 s).
    await asyncio.wait_for(restarted.run(asyncio.Event(), burst=True), 60)

    signals = await _signals(nc, topology)
    assert sorted((s.session, s.turn, s.step) for s in signals) == sorted(steps)
    assert len(signals) == 40
    starts = lambda m: sum(  # noqa: E731
        m.registry.get_sample_value(
            "tokenwire_stream_starts_total", {"provider": "scripted", "model": x}
        )
        or 0
        for x in ("m-0", "m-1")
    )
    assert starts(first) + starts(second) == 40
    duplicates = second.registry.get_sample_value("tokenwire_telemetry_duplicates_total")
    assert duplicates is not None
    assert duplicates >= 1


async def test_an_undecodable_first_chunk_is_dead_lettered_and_the_rest_continue(
    nc: Client, topology: Topology
) -> None:
    js = nc.jetstream()
    await js.publish(
        chunk_subject(topology, "bad-session", first=True),
        b"{not json",
        headers={"Nats-Msg-Id": "bad"},
    )
    await _publish_steps(nc, topology, [2, 2])
    metrics = TelemetryMetrics()
    consumer = TelemetryConsumer(nc=nc, topology=topology, metrics=metrics)
    await asyncio.wait_for(consumer.run(asyncio.Event(), burst=True), 30)
    assert metrics.registry.get_sample_value("tokenwire_telemetry_dead_lettered_total") == 1
    dlq = await js.stream_info(topology.dlq_stream)
    assert dlq.state.messages == 1
    assert len(await _signals(nc, topology)) == 2


async def test_each_new_start_is_also_sent_live_once(nc: Client, topology: Topology) -> None:
    """The live copy (core NATS, ``<prefix>.telemetry.started``): one per step signalled, as
    ``tokenwire telemetry`` wires it (``publish_event`` on the consumer's connection)."""
    lengths = [3, 1, 5, 2, 4]
    live: list[StreamStarted] = []
    all_live = asyncio.Event()

    async def on_live(msg: Msg) -> None:
        live.append(msgspec.json.decode(msg.data, type=StreamStarted))
        if len(live) >= len(lengths):
            all_live.set()

    sub = await nc.subscribe(topology.telemetry_live_subject, cb=on_live)
    steps = await _publish_steps(nc, topology, lengths)
    consumer = TelemetryConsumer(
        nc=nc,
        topology=topology,
        metrics=TelemetryMetrics(),
        live=lambda subject, payload: publish_event(nc, subject, payload),
    )
    await asyncio.wait_for(consumer.run(asyncio.Event(), burst=True), 30)
    await nc.flush()
    await asyncio.wait_for(all_live.wait(), 10)
    await sub.unsubscribe()
    assert sorted((s.session, s.turn, s.step) for s in live) == sorted(steps)
