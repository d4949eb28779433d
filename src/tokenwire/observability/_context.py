"""W3C trace context carried in broker message headers."""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry.context import Context
from opentelemetry.propagators.textmap import DefaultGetter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_propagator = TraceContextTextMapPropagator()


def parent_context(headers: Mapping[str, str] | None) -> Context | None:
    """The remote parent named by ``traceparent`` (and ``tracestate``) in ``headers``."""
    if not headers or "traceparent" not in headers:
        return None
    carrier = {k: headers[k] for k in ("traceparent", "tracestate") if k in headers}
    return _propagator.extract(carrier, getter=DefaultGetter())
