"""OpenTelemetry: time to first chunk as the GenAI semantic conventions name it.

Pinned to the GenAI conventions shipped in ``opentelemetry-semantic-conventions`` 0.66b2
(schema https://opentelemetry.io/schemas/1.44.0): the histogram
``gen_ai.client.operation.time_to_first_chunk`` (unit ``s``) with ``gen_ai.operation.name``,
``gen_ai.provider.name`` and ``gen_ai.request.model``; a span per stream start, parented on the
trace context the gateway carried in the broker headers, with the same attributes plus
``gen_ai.conversation.id`` (the session) and ``gen_ai.response.time_to_first_chunk``.
Session ids go on spans only, never on metric attributes (unbounded cardinality).
"""

from __future__ import annotations

import os

from opentelemetry import metrics, trace
from opentelemetry.propagators.textmap import DefaultGetter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tokenwire.schemas import StreamStarted

SEMCONV_SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"
TTFC_METRIC = "gen_ai.client.operation.time_to_first_chunk"
# The bucket boundaries the GenAI conventions advise for time-to-first-chunk (seconds).
TTFC_BUCKETS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96)

# tokenwire provider names -> gen_ai.provider.name well-known values.
_PROVIDER_NAMES = {
    "openai": "openai",
    "openai-responses": "openai",
    "azure": "azure.ai.openai",
    "anthropic": "anthropic",
    "deepseek": "deepseek",
    "gemini": "gcp.gemini",
    "groq": "groq",
}
_propagator = TraceContextTextMapPropagator()


def genai_provider_name(provider: str) -> str:
    """The ``gen_ai.provider.name`` value for a tokenwire provider name."""
    return _PROVIDER_NAMES.get(provider, provider)


class OtelSignals:
    """Records stream-started signals through an OpenTelemetry meter and tracer."""

    def __init__(
        self, meter_provider: metrics.MeterProvider, tracer_provider: trace.TracerProvider
    ) -> None:
        meter = meter_provider.get_meter("tokenwire.telemetry", schema_url=SEMCONV_SCHEMA_URL)
        self._ttfc = meter.create_histogram(
            TTFC_METRIC,
            unit="s",
            description="Time to receive the first chunk, from when the gateway received the "
            "request to when it normalised the first chunk of the response stream.",
            explicit_bucket_boundaries_advisory=list(TTFC_BUCKETS),
        )
        self._tracer = tracer_provider.get_tracer(
            "tokenwire.telemetry", schema_url=SEMCONV_SCHEMA_URL
        )

    def record(self, signal: StreamStarted) -> None:
        """Record one stream start: a histogram point (when TTFC is known) and a span."""
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": genai_provider_name(signal.provider),
            "gen_ai.request.model": signal.model,
        }
        if signal.time_to_first_chunk_s is not None:
            self._ttfc.record(signal.time_to_first_chunk_s, attributes)
        parent = None
        if signal.traceparent:
            parent = _propagator.extract(
                {"traceparent": signal.traceparent}, getter=DefaultGetter()
            )
        span = self._tracer.start_span(
            f"stream_started {signal.model}",
            context=parent,
            kind=trace.SpanKind.INTERNAL,
            start_time=signal.request_time_ns or signal.first_chunk_time_ns,
            attributes={
                **attributes,
                "gen_ai.conversation.id": signal.session,
                "tokenwire.turn": signal.turn,
                "tokenwire.step": signal.step,
                "tokenwire.first_block_type": signal.first_block_type or "none",
                **(
                    {"gen_ai.response.time_to_first_chunk": signal.time_to_first_chunk_s}
                    if signal.time_to_first_chunk_s is not None
                    else {}
                ),
            },
        )
        span.add_event("gen_ai.first_chunk", timestamp=signal.first_chunk_time_ns)
        span.end(end_time=signal.first_chunk_time_ns)


def otel_providers(
    readers: list[MetricReader] | None = None, processors: list[SpanProcessor] | None = None
) -> tuple[MeterProvider, TracerProvider]:
    """SDK providers: the given readers/processors, else OTLP when configured, else nothing.

    OTLP export is on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or the per-signal variables) is set;
    otherwise the SDK records into no exporter at all.
    """
    resource = Resource.create({"service.name": "tokenwire-telemetry"})
    if readers is None and processors is None and _otlp_configured():
        readers, processors = _otlp()
    tracer_provider = TracerProvider(resource=resource)
    for processor in processors or []:
        tracer_provider.add_span_processor(processor)
    return MeterProvider(resource=resource, metric_readers=readers or []), tracer_provider


def _otlp_configured() -> bool:
    return any(
        os.environ.get(v)
        for v in (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        )
    )


def _otlp() -> tuple[list[MetricReader], list[SpanProcessor]]:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return [PeriodicExportingMetricReader(OTLPMetricExporter())], [
        BatchSpanProcessor(OTLPSpanExporter())
    ]
