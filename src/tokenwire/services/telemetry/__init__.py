"""The telemetry consumer: stream-started signals at a cost that grows with steps, not tokens."""

from tokenwire.services.telemetry._errors import TelemetryError, TelemetryLoopError
from tokenwire.services.telemetry._otel import (
    FAILED_SPAN,
    SEMCONV_SCHEMA_URL,
    STARTED_SPAN,
    OtelSignals,
)
from tokenwire.services.telemetry._prometheus import TelemetryMetrics
from tokenwire.services.telemetry._run import TelemetrySettings, run
from tokenwire.services.telemetry._service import TelemetryConsumer
from tokenwire.services.telemetry._signal import failed_call, first_block_type, stream_started

__all__ = [
    "FAILED_SPAN",
    "SEMCONV_SCHEMA_URL",
    "STARTED_SPAN",
    "OtelSignals",
    "TelemetryConsumer",
    "TelemetryError",
    "TelemetryLoopError",
    "TelemetryMetrics",
    "TelemetrySettings",
    "failed_call",
    "first_block_type",
    "run",
    "stream_started",
]
