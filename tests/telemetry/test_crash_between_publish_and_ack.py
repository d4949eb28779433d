"""The telemetry consumer killed exactly between its signal's publish and its ack
(deterministic: the ``after_publish`` seam), with the first chunk redelivered after the
events stream's duplicate window closed: still no duplicate signal."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client

from tests.fixtures.broker import close_client, drop_topology, fresh_topology
from tokenwire.broker import ChunkPublisher, ConsumedMessage, Topology, connect, ensure_topology
from tokenwire.broker._provision import telemetry_ack_wait
from tokenwire.schemas import ChunkEnvelope, TextDelta, json_encoder
from tokenwire.services.telemetry import TelemetryConsumer, TelemetryMetrics

WINDOW_S = 0.5
ACK_WAIT_S = 2.0  # longer than the window: the redelivery comes after it closed
BOUND_S = 30.0


@pytest.fixture
async def short_window(nc: Client) -> AsyncIterator[Topology]:
    base = fresh_topology()
    t = Topology(
        **{
            **{f: getattr(base, f) for f in base.__dataclass_fields__},
            "duplicate_window_s": WINDOW_S,
        }
    )
    await ensure_topology(nc, t, ack_wait_s=ACK_WAIT_S, telemetry_ack_wait_s=ACK_WAIT_S)
    try:
        yield t
    finally:
        await drop_topology(nc, t)


async def _publish_first_chunk(nc: Client, t: Topology, session: str) -> None:
    publisher = await ChunkPublisher(nc, t).start()
    env = ChunkEnvelope(
        session, 0, 0, 0, 2_000, "scripted", "m", TextDelta(0, "hi"), request_time_ns=1_000
    )
    await publisher.publish(json_encoder.encode(env), session, 0, 0, 0, first=True)
    await publisher.wait_acked(session, 0, 0)
    await publisher.close()


async def _stored_signals(nc: Client, t: Topology, session: str) -> int:
    info = await nc.jetstream().stream_info(t.events_stream, subjects_filter=">")
    return int((info.state.subjects or {}).get(t.event_subject(session, "started"), 0))


def _count(metrics: TelemetryMetrics, name: str) -> float:
    labels = {"provider": "scripted", "model": "m"} if name.endswith("starts_total") else {}
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_signal_published_before_the_crash_is_not_sent_again(
    nc: Client, short_window: Topology
) -> None:
    t, session = short_window, "sess-crash"
    await _publish_first_chunk(nc, t, session)
    published_at: list[float] = []
    crashed = asyncio.Event()

    async def crash(msg: ConsumedMessage) -> None:
        published_at.append(time.monotonic())
        crashed.set()
        await asyncio.Event().wait()  # never returns: the ack is never sent

    assert nc.connected_url is not None
    dying_nc = await connect(nc.connected_url.geturl(), name="telemetry-dying")
    first = TelemetryMetrics()
    dying = TelemetryConsumer(nc=dying_nc, topology=t, metrics=first, after_publish=crash)
    pull = await dying.consumer().start()
    await asyncio.wait_for(crashed.wait(), BOUND_S)
    assert await _stored_signals(nc, t, session) == 1
    await pull.stop(timeout_s=0.1, release=True)
    await close_client(dying_nc)  # the process is gone; nothing was acked

    second = TelemetryMetrics()
    redelivered: list[float] = []

    async def note(msg: ConsumedMessage) -> None:
        redelivered.append(time.monotonic())

    restarted = TelemetryConsumer(nc=nc, topology=t, metrics=second, after_publish=note)
    stop = asyncio.Event()
    run = asyncio.create_task(restarted.run(stop))
    try:
        deadline = time.monotonic() + BOUND_S
        while _count(second, "tokenwire_telemetry_duplicates_total") < 1 and not redelivered:
            assert time.monotonic() < deadline, "the first chunk was never redelivered"
            assert not run.done(), run
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await asyncio.wait_for(run, BOUND_S)
    assert redelivered == [], "the redelivered first chunk's signal was published again"
    assert await _stored_signals(nc, t, session) == 1
    assert _count(first, "tokenwire_stream_starts_total") == 0  # died before recording
    assert _count(second, "tokenwire_stream_starts_total") == 0
    info = await nc.jetstream().consumer_info(t.stream, t.telemetry_consumer)
    assert info.num_ack_pending == 0  # the redelivery was acked


def test_the_default_telemetry_ack_wait_is_inside_the_duplicate_window() -> None:
    t = Topology()
    assert telemetry_ack_wait(t) < t.duplicate_window_s
    assert telemetry_ack_wait(t, ack_wait_s=10.0) == 10.0
