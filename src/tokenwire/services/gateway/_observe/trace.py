"""W3C trace context for a step: the model call's CLIENT span, continued from the caller's
``traceparent`` or started here.

The span (``chat {model}``, the GenAI conventions' ``gen_ai.client.inference``) is a child of
the incoming context, and its context is what the step's first broker message (ordinal 0)
carries, so the assembler's and the telemetry consumer's spans join the same trace. Without an
SDK tracer provider (no OTLP endpoint) and without a caller's context, a fresh span context with
random ids is made anyway, so that every step's first message carries a ``traceparent``.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import AttributeValue

_propagator = TraceContextTextMapPropagator()


def start_step_span(
    headers: Mapping[str, str],
    rng: random.Random,
    *,
    tracer: trace.Tracer,
    recording: bool,
    name: str,
    attributes: Mapping[str, AttributeValue],
    start_ns: int,
) -> tuple[trace.Span, dict[str, str]]:
    """The call's span and the headers (``traceparent``, maybe ``tracestate``) to publish.

    Without a caller's context and without a recording tracer (``recording``), the fresh
    context is made and written directly: the OpenTelemetry calls that come to the same answer
    cost ~40 us of the time to first chunk (bench/bench_gateway.py (d)).
    """
    if "traceparent" not in headers and not recording:
        context = _fresh_context(rng)
        traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-01"
        return trace.NonRecordingSpan(context), {"traceparent": traceparent}
    parent = _propagator.extract(carrier=headers)  # read by key, not copied
    span = tracer.start_span(
        name,
        context=parent,
        kind=trace.SpanKind.CLIENT,
        attributes=attributes if recording else None,
        start_time=start_ns,
    )
    if not span.get_span_context().is_valid:
        span = trace.NonRecordingSpan(_fresh_context(rng))
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(span))
    return span, carrier


def _fresh_context(rng: random.Random) -> trace.SpanContext:
    return trace.SpanContext(
        trace_id=rng.getrandbits(128) or 1,
        span_id=rng.getrandbits(64) or 1,
        is_remote=False,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
