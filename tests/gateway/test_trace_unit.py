"""The step's trace context: the fast path writes what OpenTelemetry's propagator writes."""

from __future__ import annotations

import random

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tokenwire.services.gateway._observe.trace import start_step_span as _start

PROPAGATOR = TraceContextTextMapPropagator()
NO_TRACER = trace.NoOpTracerProvider().get_tracer("test")


def start_step_span(headers, rng, tracer=NO_TRACER, recording=False):
    return _start(
        headers,
        rng,
        tracer=tracer,
        recording=recording,
        name="chat m",
        attributes={"gen_ai.request.model": "m"},
        start_ns=1,
    )


def test_a_fresh_context_is_what_the_propagator_would_inject() -> None:
    span, headers = start_step_span({}, random.Random(7))
    oracle: dict[str, str] = {}
    PROPAGATOR.inject(oracle, context=trace.set_span_in_context(span))
    assert headers == oracle
    context = trace.get_current_span(PROPAGATOR.extract(headers)).get_span_context()
    assert context.is_valid
    assert context.trace_flags.sampled
    assert (context.trace_id, context.span_id) == (
        span.get_span_context().trace_id,
        span.get_span_context().span_id,
    )


def test_fresh_contexts_differ() -> None:
    rng = random.Random(7)
    assert start_step_span({}, rng)[1] != start_step_span({}, rng)[1]


def test_a_callers_context_is_continued() -> None:
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    _, headers = start_step_span({"traceparent": caller, "tracestate": "k=v"}, random.Random())
    assert headers["traceparent"].split("-")[1] == "0af7651916cd43dd8448eb211c80319c"
    assert headers["tracestate"] == "k=v"


def test_a_recording_tracer_makes_a_client_span_the_headers_point_at() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    span, headers = start_step_span(
        {"traceparent": caller}, random.Random(), provider.get_tracer("t"), recording=True
    )
    span.end()
    [finished] = exporter.get_finished_spans()
    assert finished.kind is trace.SpanKind.CLIENT
    assert finished.name == "chat m"
    assert finished.parent is not None
    assert finished.parent.span_id == 0xB7AD6B7169203331
    assert headers["traceparent"] == (
        f"00-0af7651916cd43dd8448eb211c80319c-{finished.context.span_id:016x}-01"
    )
