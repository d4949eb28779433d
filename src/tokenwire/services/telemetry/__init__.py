"""The telemetry consumer: stream-started signals at a cost that grows with steps, not tokens."""

from tokenwire.services.telemetry._otel import (
    SEMCONV_SCHEMA_URL,
    TTFC_METRIC,
    OtelSignals,
    genai_provider_name,
    otel_providers,
)
from tokenwire.services.telemetry._prometheus import TelemetryMetrics
from tokenwire.services.telemetry._run import TelemetrySettings, run
from tokenwire.services.telemetry._service import TelemetryConsumer
from tokenwire.services.telemetry._signal import first_block_type, stream_started

__all__ = [
    "SEMCONV_SCHEMA_URL",
    "TTFC_METRIC",
    "OtelSignals",
    "TelemetryConsumer",
    "TelemetryMetrics",
    "TelemetrySettings",
    "first_block_type",
    "genai_provider_name",
    "otel_providers",
    "run",
    "stream_started",
]
