"""Prometheus metrics of the telemetry consumer (a registry per instance).

Model labels are bounded (``tokenwire.observability.model_labels``): a model becomes a label
value when a step of it started streaming; failed calls of a model never seen starting count
under ``other``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tokenwire.observability import error_type_labels, model_labels
from tokenwire.observability.conventions import ERROR_OTHER, LATENCY_BUCKETS_S
from tokenwire.schemas import ChunkEnvelope, StepError, StreamStarted


class TelemetryMetrics:
    """Stream starts, failed calls and time to first chunk by provider and model, and the
    consumer's health."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.models = model_labels()
        self.error_types = error_type_labels()
        self.starts = Counter(
            "tokenwire_stream_starts_total",
            "Steps whose stream started (first chunk not an error), by provider and model.",
            ["provider", "model"],
            registry=self.registry,
        )
        self.failed = Counter(
            "tokenwire_telemetry_failed_calls_total",
            "Steps whose first chunk is finish {error}: failed calls, by error.type.",
            ["provider", "model", "error_type"],
            registry=self.registry,
        )
        self.ttfc = Histogram(
            "tokenwire_time_to_first_chunk_seconds",
            "Successful calls: from the gateway receiving the request to the first chunk.",
            ["provider", "model"],
            buckets=LATENCY_BUCKETS_S,
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
            "First chunks not yet delivered to the telemetry consumers (summed over the shards).",
            registry=self.registry,
        )
        self.lag_seconds = Gauge(
            "tokenwire_telemetry_consumer_lag_seconds",
            "The longest wait of undelivered first chunks without a delivery (0: none waits).",
            registry=self.registry,
        )
        self.ready = Gauge(
            "tokenwire_telemetry_ready",
            "1 when the telemetry consumer can do its job (/readyz answers 200).",
            registry=self.registry,
        )
        self.not_ready = Gauge(
            "tokenwire_telemetry_not_ready",
            "1 for each reason the telemetry consumer is not ready (docs/telemetry.md).",
            ["reason"],
            registry=self.registry,
        )
        self.restored = Counter(
            "tokenwire_telemetry_restored_total",
            "Telemetry consumers (or the topology) the broker said were missing, created again.",
            registry=self.registry,
        )

    def record(self, signal: StreamStarted) -> None:
        """Count one stream start (and its time to first chunk when known)."""
        model = self.models.admit(signal.model)
        self.starts.labels(signal.provider, model).inc()
        if signal.time_to_first_chunk_s is not None:
            self.ttfc.labels(signal.provider, model).observe(signal.time_to_first_chunk_s)

    def record_failure(self, envelope: ChunkEnvelope, error: StepError) -> str:
        """Count one failed call; returns its ``error.type``."""
        error_type = self.error_types.admit(error.code) if error.code else ERROR_OTHER
        model = self.models.known(envelope.model)
        self.failed.labels(envelope.provider, model, error_type).inc()
        return error_type
