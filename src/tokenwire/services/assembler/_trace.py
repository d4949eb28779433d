"""The assembler's span per committed step, joined to the step's trace.

The gateway publishes each step's first chunk with the model call's ``traceparent`` in the
NATS headers.
When an SDK tracer provider is installed (an OTLP endpoint is configured), the assembler keeps
the context of each open step's first chunk (bounded: the oldest are dropped past
``MAX_OPEN``) and, once the store committed the step, emits ``tokenwire.assembler.commit``
(INTERNAL) as a child of the call's span, from the first chunk's arrival here to the commit.
Without an SDK nothing is kept and nothing is recorded.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

from opentelemetry import trace
from opentelemetry.context import Context

from tokenwire.observability import OtelProviders, conventions, parent_context

MAX_OPEN = 10_000
SPAN_NAME = "tokenwire.assembler.commit"
StepKey = tuple[str, int, int]


class StepTraces:
    """Remembers open steps' trace contexts and emits a span per committed step."""

    def __init__(self, otel: OtelProviders, clock: Callable[[], int] = time.time_ns) -> None:
        self.enabled = otel.sdk  # an SDK tracer provider is installed (no SDK import here)
        self._tracer = otel.tracer_provider.get_tracer(
            "tokenwire.assembler", schema_url=conventions.SCHEMA_URL
        )
        self._clock = clock
        self._open: OrderedDict[StepKey, tuple[Context, int]] = OrderedDict()

    def first_chunk(self, key: StepKey, headers: Mapping[str, str] | None) -> None:
        """A step's first chunk arrived (call only for ordinal 0)."""
        if not self.enabled:
            return
        parent = parent_context(headers)
        if parent is None:
            return
        self._open[key] = (parent, self._clock())
        while len(self._open) > MAX_OPEN:
            self._open.popitem(last=False)

    def committed(self, key: StepKey, outcome: str, seq_start: int, seq_end: int) -> None:
        """The store committed the step: its span, if its first chunk's context is known."""
        held = self._open.pop(key, None)
        if held is None:
            return
        parent, start_ns = held
        span = self._tracer.start_span(
            SPAN_NAME,
            context=parent,
            kind=trace.SpanKind.INTERNAL,
            start_time=start_ns,
            attributes={
                "tokenwire.session": key[0],
                "tokenwire.turn": key[1],
                "tokenwire.step": key[2],
                "tokenwire.outcome": outcome,
                "tokenwire.seq_start": seq_start,
                "tokenwire.seq_end": seq_end,
            },
        )
        span.end()
