"""The OpenTelemetry SDK for one service: installed when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or a
per-signal endpoint) is set, nothing otherwise.

The standard variables are honoured: ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``
name the service (the service's own name is only the default when neither says one),
``OTEL_TRACES_SAMPLER`` / ``_ARG`` choose the sampler, ``OTEL_SDK_DISABLED=true`` turns the
SDK off, and the exporters read their own ``OTEL_EXPORTER_OTLP_*`` settings (headers,
timeout, compression) and the batch/export intervals theirs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote

from opentelemetry import metrics, trace

from tokenwire.observability.conventions import legacy_names

if TYPE_CHECKING:
    # The SDK is imported where it is used: a service without an OTLP endpoint (the common
    # case, and every service the tests start) runs on the API's no-op providers and never
    # pays the SDK's import (tens of ms of CPU per process).
    from opentelemetry.sdk.metrics.export import MetricReader
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import SpanProcessor

_ENDPOINTS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)


@dataclass(frozen=True)
class OtelProviders:
    """A service's meter and tracer providers; ``sdk`` is False for the API's no-op ones;
    ``legacy_names``: also emit the v1.41 GenAI metric names (``OTEL_SEMCONV_STABILITY_OPT_IN``).
    """

    meter_provider: metrics.MeterProvider
    tracer_provider: trace.TracerProvider
    sdk: bool
    legacy_names: bool = False

    def shutdown(self) -> None:
        """Flush and stop the SDK providers (a no-op for the API's)."""
        if not self.sdk:
            return
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider

        if isinstance(self.meter_provider, MeterProvider):
            self.meter_provider.shutdown()
        if isinstance(self.tracer_provider, TracerProvider):
            self.tracer_provider.shutdown()

    def force_flush(self) -> None:
        """Export everything recorded so far (bounded by the exporters' timeouts)."""
        if not self.sdk:
            return
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider

        if isinstance(self.meter_provider, MeterProvider):
            self.meter_provider.force_flush()
        if isinstance(self.tracer_provider, TracerProvider):
            self.tracer_provider.force_flush()


def no_otel() -> OtelProviders:
    """The API's no-op providers: nothing is recorded or exported."""
    return OtelProviders(metrics.NoOpMeterProvider(), trace.NoOpTracerProvider(), sdk=False)


def otlp_configured(env: Mapping[str, str]) -> bool:
    """Whether an OTLP endpoint is set (and the SDK not disabled)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(env.get(v) for v in _ENDPOINTS)


def resource_for(service: str, env: Mapping[str, str]) -> Resource:
    """The resource: ``OTEL_RESOURCE_ATTRIBUTES`` and ``OTEL_SERVICE_NAME`` over ``service``."""
    from opentelemetry.sdk.resources import Resource

    attributes: dict[str, str] = {"service.name": service}
    for item in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            attributes[key.strip()] = unquote(value.strip())
    if env.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = env["OTEL_SERVICE_NAME"]
    return Resource.create(attributes)


def sdk_providers(
    service: str,
    env: Mapping[str, str],
    readers: list[MetricReader],
    processors: list[SpanProcessor],
) -> OtelProviders:
    """SDK providers for ``service`` recording into the given readers and span processors."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    resource = resource_for(service, env)
    tracer_provider = TracerProvider(resource=resource)  # the sampler from OTEL_TRACES_SAMPLER
    for processor in processors:
        tracer_provider.add_span_processor(processor)
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)
    return OtelProviders(meter_provider, tracer_provider, sdk=True, legacy_names=legacy_names(env))


def otel_from_env(service: str, env: Mapping[str, str] | None = None) -> OtelProviders:
    """OTLP/HTTP export for ``service`` when an endpoint is configured, else :func:`no_otel`."""
    env = os.environ if env is None else env
    if not otlp_configured(env):
        return no_otel()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    traces = _signal_endpoint(env, "TRACES", "v1/traces")
    metric_url = _signal_endpoint(env, "METRICS", "v1/metrics")
    readers: list[MetricReader] = [
        PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=metric_url))
    ]
    processors: list[SpanProcessor] = [BatchSpanProcessor(OTLPSpanExporter(endpoint=traces))]
    return sdk_providers(service, env, readers, processors)


def _signal_endpoint(env: Mapping[str, str], signal: str, path: str) -> str | None:
    """The per-signal endpoint as given, else the base endpoint with the signal's path."""
    own = env.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    if own:
        return own
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    return f"{base.rstrip('/')}/{path}" if base else None
