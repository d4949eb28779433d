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
    """The step's span and the headers (``traceparent``, maybe ``tracestate``) to publish."""
    parent = _propagator.extract(carrier=headers)  # read by key, not copied
    span = _tracer.start_span("tokenwire.gateway.step", context=parent, kind=trace.SpanKind.SERVER)
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
