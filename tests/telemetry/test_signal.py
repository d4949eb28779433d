"""The signal and its OpenTelemetry form, checked with the SDK's in-memory reader and exporter."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    ChunkEnvelope,
    Finish,
    ReasoningDelta,
    StepError,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallDelta,
    Usage,
    json_encoder,
)
from tokenwire.services.telemetry import (
    TTFC_METRIC,
    OtelSignals,
    TelemetryMetrics,
    otel_providers,
    stream_started,
)

SENTINEL = "SENTINEL-7f3a"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _envelope(chunk: StreamChunk, request_ns: int | None = 1_000_000_000) -> ChunkEnvelope:
    return ChunkEnvelope(
        session="s-1", turn=2, step=3, ordinal=0, time_ns=1_250_000_000,
        provider="openai", model="gpt-4o", chunk=chunk, request_time_ns=request_ns,
    )  # fmt: skip


FIRST_CHUNKS: list[tuple[StreamChunk, str | None]] = [
    (BlockStart(index=0, block_type="text"), "text"),
    (TextDelta(index=0, text=SENTINEL), "text"),
    (ReasoningDelta(index=0, text=SENTINEL), "reasoning"),
    (
        ToolCallDelta(index=0, id="call_1", name=SENTINEL, arguments_delta=f'{{"q":"{SENTINEL}"}}'),
        "tool-call",
    ),
    (BlockEnd(index=0, block=TextBlock(text=SENTINEL)), "text"),
    (Usage(usage=TokenUsage(input_tokens=3)), None),
    (Finish(reason="error", error=StepError(message=SENTINEL)), None),
]


@pytest.mark.parametrize(("chunk", "block_type"), FIRST_CHUNKS)
def test_signal_carries_identity_and_timing_never_content(
    chunk: StreamChunk, block_type: str | None
) -> None:
    signal = stream_started(_envelope(chunk), TRACEPARENT)
    assert (signal.session, signal.turn, signal.step) == ("s-1", 2, 3)
    assert (signal.provider, signal.model) == ("openai", "gpt-4o")
    assert signal.first_block_type == block_type
    assert signal.time_to_first_chunk_s == pytest.approx(0.25)
    assert SENTINEL.encode() not in json_encoder.encode(signal)


def test_unknown_request_time_gives_no_time_to_first_chunk() -> None:
    signal = stream_started(_envelope(TextDelta(index=0, text="x"), request_ns=None), None)
    assert signal.time_to_first_chunk_s is None
    assert signal.traceparent is None


def test_otel_metric_and_span_follow_the_genai_conventions() -> None:
    reader, exporter = InMemoryMetricReader(), InMemorySpanExporter()
    meters, tracers = otel_providers(readers=[reader], processors=[SimpleSpanProcessor(exporter)])
    OtelSignals(meters, tracers).record(
        stream_started(_envelope(TextDelta(index=0, text=SENTINEL)), TRACEPARENT)
    )

    data = reader.get_metrics_data()
    assert data is not None
    metrics = [m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics]
    (ttfc,) = [m for m in metrics if m.name == TTFC_METRIC]
    assert ttfc.name == "gen_ai.client.operation.time_to_first_chunk"
    assert ttfc.unit == "s"
    (point,) = ttfc.data.data_points
    assert point.count == 1
    assert point.sum == pytest.approx(0.25)
    assert dict(point.attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "gpt-4o",
    }

    (span,) = exporter.get_finished_spans()
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None
    assert format(span.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert span.attributes["gen_ai.conversation.id"] == "s-1"
    assert span.attributes["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.25)
    assert all(SENTINEL not in str(v) for v in span.attributes.values())
    meters.shutdown()
    tracers.shutdown()


def test_prometheus_counts_starts_by_provider_and_model() -> None:
    metrics = TelemetryMetrics()
    signal = stream_started(_envelope(TextDelta(index=0, text="x")), None)
    metrics.record(signal)
    metrics.record(signal)
    labels = {"provider": "openai", "model": "gpt-4o"}
    assert metrics.registry.get_sample_value("tokenwire_stream_starts_total", labels) == 2
    assert (
        metrics.registry.get_sample_value("tokenwire_time_to_first_chunk_seconds_count", labels)
        == 2
    )
    assert metrics.registry.get_sample_value(
        "tokenwire_time_to_first_chunk_seconds_sum", labels
    ) == pytest.approx(0.5)
