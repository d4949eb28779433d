"""The signal and its OpenTelemetry form, checked with the SDK's in-memory reader and exporter."""

from __future__ import annotations

import msgspec
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tokenwire.observability import sdk_providers
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
    FAILED_SPAN,
    STARTED_SPAN,
    OtelSignals,
    TelemetryMetrics,
    failed_call,
    stream_started,
)

SENTINEL = "SENTINEL-7f3a"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


def _envelope(chunk: StreamChunk, request_ns: int | None = 1_000_000_000) -> ChunkEnvelope:
    return ChunkEnvelope(
        session="s-1",
        turn=2,
        step=3,
        ordinal=0,
        time_ns=1_250_000_000,
        provider="openai",
        model="gpt-4o",
        chunk=chunk,
        request_time_ns=request_ns,
    )


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


def test_otel_spans_join_the_steps_trace_with_the_genai_attributes() -> None:
    exporter = InMemorySpanExporter()
    otel = sdk_providers("t", {}, [], [SimpleSpanProcessor(exporter)])
    signals = OtelSignals(otel.tracer_provider)
    signals.record(stream_started(_envelope(TextDelta(index=0, text=SENTINEL)), TRACEPARENT))
    failed = _envelope(Finish(reason="error", error=StepError(message=SENTINEL, code="overloaded")))
    signals.record_failure(failed, "overloaded", {"traceparent": TRACEPARENT})

    started, failure = exporter.get_finished_spans()
    assert (started.name, failure.name) == (STARTED_SPAN, FAILED_SPAN)
    for span in (started, failure):
        assert format(span.context.trace_id, "032x") == TRACE_ID
        assert span.parent is not None
        assert format(span.parent.span_id, "016x") == "00f067aa0ba902b7"
        assert span.attributes is not None
        assert span.attributes["gen_ai.provider.name"] == "openai"
        assert span.attributes["gen_ai.request.model"] == "gpt-4o"
        assert span.attributes["gen_ai.conversation.id"] == "s-1"
        assert all(SENTINEL not in str(v) for v in span.attributes.values())
    assert started.attributes is not None
    assert started.attributes["gen_ai.response.time_to_first_chunk"] == pytest.approx(0.25)
    assert failure.attributes is not None
    assert failure.attributes["error.type"] == "overloaded"
    assert not failure.status.is_ok
    otel.shutdown()


def test_an_error_first_chunk_is_a_failed_call_not_a_start() -> None:
    metrics = TelemetryMetrics()
    ok = _envelope(TextDelta(index=0, text="x"))
    metrics.record(stream_started(ok, None))  # admits the model as a label value
    env = _envelope(Finish(reason="error", error=StepError(message=SENTINEL, code="rate_limit")))
    error = failed_call(env)
    assert error is not None
    assert failed_call(ok) is None
    assert metrics.record_failure(env, error) == "rate_limit"
    labels = {"provider": "openai", "model": "gpt-4o"}
    failed = {**labels, "error_type": "rate_limit"}
    assert metrics.registry.get_sample_value("tokenwire_telemetry_failed_calls_total", failed) == 1
    assert metrics.registry.get_sample_value("tokenwire_stream_starts_total", labels) == 1
    ttfc = "tokenwire_time_to_first_chunk_seconds_count"
    assert metrics.registry.get_sample_value(ttfc, labels) == 1


def test_model_labels_are_bounded() -> None:
    metrics = TelemetryMetrics()
    metrics.models.limit = 2
    for model in ("a", "b", "c", "bad model\n{}"):
        env = msgspec.structs.replace(_envelope(TextDelta(index=0, text="x")), model=model)
        metrics.record(stream_started(env, None))
    starts = {
        s.labels["model"]: s.value
        for m in metrics.registry.collect()
        for s in m.samples
        if s.name == "tokenwire_stream_starts_total"
    }
    assert starts == {"a": 1, "b": 1, "other": 2}


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
