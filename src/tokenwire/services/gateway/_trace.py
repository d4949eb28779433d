"""W3C trace context for a step: continued from the caller's ``traceparent`` or started here.

The step's span is a child of the incoming context. When no tracer provider is configured
(the API's no-op default) and the caller sent no context, a fresh span context with random
ids is made anyway, so every step's broker messages carry a ``traceparent`` that telemetry can
join on.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_propagator = TraceContextTextMapPropagator()
_tracer = trace.get_tracer("tokenwire.gateway")


def start_step_span(
    headers: Mapping[str, str], rng: random.Random
) -> tuple[trace.Span, dict[str, str]]:
    """The step's span and the headers (``traceparent``, maybe ``tracestate``) to publish.

    Without a caller's context and without a tracer provider that records spans, the fresh
    context is made and written directly: the OpenTelemetry calls that come to the same
    answer cost ~40 us of the time to first chunk (bench/bench_gateway.py (d)).
    """
    if "traceparent" not in headers and not _recording():
        context = _fresh_context(rng)
        traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-01"
        return trace.NonRecordingSpan(context), {"traceparent": traceparent}
    parent = _propagator.extract(carrier=headers)  # read by key, not copied
    span = _tracer.start_span("tokenwire.gateway.step", context=parent, kind=trace.SpanKind.SERVER)
    if not span.get_span_context().is_valid:
        span = trace.NonRecordingSpan(_fresh_context(rng))
    carrier: dict[str, str] = {}
    _propagator.inject(carrier, context=trace.set_span_in_context(span))
    return span, carrier


def _recording() -> bool:
    """Whether a tracer provider that may record spans is installed (the API's defaults
    never do)."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def _fresh_context(rng: random.Random) -> trace.SpanContext:
    return trace.SpanContext(
        trace_id=rng.getrandbits(128) or 1,
        span_id=rng.getrandbits(64) or 1,
        is_remote=False,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
