"""The step's trace context: the fast path writes what OpenTelemetry's propagator writes."""

from __future__ import annotations

import random

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tokenwire.services.gateway import _trace
from tokenwire.services.gateway._trace import start_step_span

PROPAGATOR = TraceContextTextMapPropagator()


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


def test_only_a_real_tracer_provider_counts_as_recording(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not _trace._recording()  # the API's default in tests
    monkeypatch.setattr(trace, "get_tracer_provider", TracerProvider)
    assert _trace._recording()
