"""A signal the events stream stored whose PubAck was lost (a timeout: the request applied,
its answer did not come back) is still counted, once, when its first chunk comes back.

The broker is an in-memory twin of the two requests the consumer makes: the acknowledged
publish (deduplicated by ``Nats-Msg-Id``, like the stream's window) and the stored-message
lookup by msg id.
"""

from __future__ import annotations

from typing import Any

import pytest

from tokenwire.broker import ConsumedMessage, RequestFailed, Retry, Topology
from tokenwire.schemas import ChunkEnvelope, TextDelta, json_encoder
from tokenwire.services.telemetry import TelemetryConsumer, TelemetryMetrics, _service

STARTS = "tokenwire_stream_starts_total"


class EventsTwin:
    """Stores each msg id once; the first ``lose`` publishes are stored but answered by a
    timeout, as when the PubAck is lost on the way back."""

    def __init__(self, lose: int) -> None:
        self.stored: list[str] = []
        self.lose = lose

    async def publish_acked(self, nc: Any, subject: str, payload: bytes, **kw: Any) -> bool:
        msg_id = kw["headers"]["Nats-Msg-Id"]
        duplicate = msg_id in self.stored
        if not duplicate:
            self.stored.append(msg_id)
        if self.lose:
            self.lose -= 1
            raise RequestFailed(f"publish to {subject}", "TimeoutError")
        return duplicate

    async def stored_with_msg_id(
        self, nc: Any, stream: str, subject: str, msg_id: str, **kw: Any
    ) -> bool:
        return msg_id in self.stored


def _first_chunk(times: int) -> ConsumedMessage:
    env = ChunkEnvelope("s1", 0, 0, 0, 2_000, "scripted", "m", TextDelta(0, "hi"))
    reply = f"$JS.ACK.TOKENWIRE.telemetry.{times}.7.{times}.0.0"
    data = json_encoder.encode(env)
    return ConsumedMessage("tw.chunks.0.s1.first", reply, data, None, None, None)  # type: ignore[arg-type]  # never settled here


@pytest.fixture
def twin(monkeypatch: pytest.MonkeyPatch) -> EventsTwin:
    twin = EventsTwin(lose=1)
    monkeypatch.setattr(_service, "publish_acked", twin.publish_acked)
    monkeypatch.setattr(_service, "stored_with_msg_id", twin.stored_with_msg_id)
    return twin


async def test_a_stored_signal_whose_puback_was_lost_is_counted_on_its_redelivery(
    twin: EventsTwin,
) -> None:
    metrics = TelemetryMetrics()
    live: list[bytes] = []

    async def send_live(subject: str, payload: bytes) -> None:
        live.append(payload)

    consumer = TelemetryConsumer(nc=None, topology=Topology(), metrics=metrics, live=send_live)  # type: ignore[arg-type]  # the twin answers
    with pytest.raises(Retry):
        await consumer.handle(_first_chunk(times=1))
    await consumer.handle(_first_chunk(times=2))  # nak'd: redelivered
    await consumer.handle(_first_chunk(times=3))  # e.g. its ack lost: a true duplicate

    assert twin.stored == ["started:s1:0:0"]
    labels = {"provider": "scripted", "model": "m"}
    assert metrics.registry.get_sample_value(STARTS, labels) == 1.0
    assert len(live) == 1
    assert metrics.registry.get_sample_value("tokenwire_telemetry_duplicates_total") == 1.0
