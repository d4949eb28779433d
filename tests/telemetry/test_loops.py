"""A pull loop of the telemetry consumer that ends on an error it did not expect stops the
instance with TelemetryLoopError, instead of leaving it running and ready with no first chunk
handled (real nats-server; the fault is injected where the worker acknowledges)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable

import pytest
from nats.aio.client import Client

from tests.fixtures.broker import provisioned
from tokenwire.broker import ChunkPublisher, ConsumedMessage, Topology, _consumer
from tokenwire.schemas import ChunkEnvelope, TextDelta, json_encoder
from tokenwire.services.telemetry import TelemetryConsumer, TelemetryLoopError, TelemetryMetrics

BOUND_S = 15.0


@pytest.fixture
async def topology(nc: Client) -> AsyncIterator[Topology]:
    async with provisioned(nc) as t:
        yield t


async def _publish_first_chunk(nc: Client, t: Topology, session: str) -> None:
    publisher = await ChunkPublisher(nc, t).start()
    env = ChunkEnvelope(session, 0, 0, 0, 2_000, "scripted", "m", TextDelta(0, "hi"))
    await publisher.publish(json_encoder.encode(env), session, 0, 0, 0, first=True)
    await publisher.wait_acked(session, 0, 0)
    await publisher.close()


async def test_a_worker_that_ends_stops_the_instance_with_a_typed_error(
    nc: Client, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def reset(messages: Iterable[ConsumedMessage]) -> int:
        raise ConnectionResetError("the transport's drain: connection reset by peer")

    monkeypatch.setattr(_consumer, "ack_many", reset)
    await _publish_first_chunk(nc, topology, "sess-loop")
    consumer = TelemetryConsumer(nc=nc, topology=topology, metrics=TelemetryMetrics())

    with pytest.raises(TelemetryLoopError) as caught:
        await asyncio.wait_for(consumer.run(asyncio.Event()), BOUND_S)

    assert caught.value.loop == f"work-{topology.telemetry_consumer}"
    assert "ConnectionResetError" in caught.value.reason
