"""Prometheus metrics of the telemetry consumer (a registry per instance)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tokenwire.schemas import StreamStarted
from tokenwire.services.telemetry._otel import TTFC_BUCKETS


class TelemetryMetrics:
    """Stream starts and time to first chunk by provider and model, and the consumer's health."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.starts = Counter(
            "tokenwire_stream_starts_total",
            "Steps whose stream started, by provider and model.",
            ["provider", "model"],
            registry=self.registry,
        )
        self.ttfc = Histogram(
            "tokenwire_time_to_first_chunk_seconds",
            "Time from the gateway receiving a request to the first normalised chunk.",
            ["provider", "model"],
            buckets=TTFC_BUCKETS,
            registry=self.registry,
        )
        self.duplicates = Counter(
            "tokenwire_telemetry_duplicates_total",
            "Redelivered first chunks whose signal had already been sent (not re-counted).",
            registry=self.registry,
        )
        self.dead_lettered = Counter(
            "tokenwire_telemetry_dead_lettered_total",
            "First-chunk messages that did not decode, moved to the dead-letter subject.",
            registry=self.registry,
        )
        self.lag = Gauge(
            "tokenwire_telemetry_consumer_lag_messages",
            "First chunks on the stream not yet delivered to the telemetry consumer.",
            registry=self.registry,
        )

    def record(self, signal: StreamStarted) -> None:
        """Count one stream start (and its time to first chunk when known)."""
        self.starts.labels(signal.provider, signal.model).inc()
        if signal.time_to_first_chunk_s is not None:
            self.ttfc.labels(signal.provider, signal.model).observe(signal.time_to_first_chunk_s)
