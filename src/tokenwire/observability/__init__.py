"""Observability shared by the services: pinned GenAI convention names, bounded labels, the
OpenTelemetry SDK set up from the standard ``OTEL_*`` variables, and the metrics and probe
server."""

from tokenwire.observability import conventions
from tokenwire.observability._context import parent_context
from tokenwire.observability._labels import (
    OTHER,
    BoundedLabels,
    error_type_labels,
    model_labels,
)
from tokenwire.observability._probes import ProbeServer, WsgiApp, probe_app
from tokenwire.observability._setup import (
    OtelProviders,
    no_otel,
    otel_from_env,
    otlp_configured,
    resource_for,
    sdk_providers,
)

__all__ = [
    "OTHER",
    "BoundedLabels",
    "OtelProviders",
    "ProbeServer",
    "WsgiApp",
    "conventions",
    "error_type_labels",
    "model_labels",
    "no_otel",
    "otel_from_env",
    "otlp_configured",
    "parent_context",
    "probe_app",
    "resource_for",
    "sdk_providers",
]
