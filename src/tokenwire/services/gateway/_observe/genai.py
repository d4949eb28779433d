"""One model call as the GenAI conventions see it: the CLIENT span and the call's figures.

:class:`GenAICalls` holds the instruments (Prometheus in the gateway's registry, OpenTelemetry
when an SDK is installed); a :class:`CallObserver` per step is told four things by the step,
none of them per token: the first chunk (its time), the usage chunk, an HTTP error status and
the end. Time per output chunk is the mean gap after the first chunk, from the first and last
chunk times and the chunk count, one sample per call.

"First chunk" (docs/telemetry.md): a step's ordinal 0 unless it is ``finish {error}``. A step
whose first chunk is an error is a failed call: it is counted under ``error.type`` and never as
a stream start or a time-to-first-chunk sample. The gateway's time to first chunk is recorded
when the call ends, and only for a call that succeeded (a stream that failed midway is an error,
not a TTFC sample); the span has the attribute and a ``tokenwire.stream_started`` event either
way.

Nothing here reads content: only identity, times, finish reasons, token counts and error codes.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.util.types import AttributeValue

from tokenwire.observability import (
    BoundedLabels,
    OtelProviders,
    conventions,
    error_type_labels,
    model_labels,
)
from tokenwire.schemas import Finish, Routed, TokenUsage
from tokenwire.services.gateway._errors import BrokerUnavailableError, GatewayError
from tokenwire.services.gateway._observe.metrics import GatewayMetrics
from tokenwire.services.gateway._routing.routing import Route

Outcome = Literal["ok", "error", "aborted"]
_TOKEN_TYPES = ("input", "output", "cache_read", "cache_write", "reasoning")


@functools.lru_cache(maxsize=256)
def server_of(url: str) -> tuple[str, int]:
    """``server.address`` and ``server.port`` of a provider URL."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.hostname or "", port


class GenAICalls:
    """The instruments every call records into; one per gateway app."""

    def __init__(self, prometheus: GatewayMetrics, otel: OtelProviders) -> None:
        self.prometheus = prometheus
        self.models: BoundedLabels = model_labels()
        self.error_types: BoundedLabels = error_type_labels()
        self.tracer = otel.tracer_provider.get_tracer(
            "tokenwire.gateway", schema_url=conventions.SCHEMA_URL
        )
        self.recording = otel.sdk
        schema = conventions.SCHEMA_URL
        meter = otel.meter_provider.get_meter("tokenwire.gateway", schema_url=schema)
        seconds = list(conventions.LATENCY_BUCKETS_S)
        self.duration = meter.create_histogram(
            conventions.DURATION,
            unit="s",
            description="GenAI client inference duration.",
            explicit_bucket_boundaries_advisory=seconds,
        )
        self.ttfc = meter.create_histogram(
            conventions.TIME_TO_FIRST_CHUNK,
            unit="s",
            description="Time to receive the first chunk of a successful streaming call.",
            explicit_bucket_boundaries_advisory=seconds,
        )
        self.chunk_gap = meter.create_histogram(
            conventions.TIME_PER_OUTPUT_CHUNK,
            unit="s",
            description="Mean time per output chunk after the first, one sample per call.",
            explicit_bucket_boundaries_advisory=list(conventions.CHUNK_GAP_BUCKETS_S),
        )
        self.usage = UsageTotals()
        for name, desc in (
            (conventions.USAGE_INPUT, "Input tokens, including cached ones."),
            (conventions.USAGE_OUTPUT, "Output tokens, including reasoning ones."),
            (conventions.USAGE_CACHE_READ, "Input tokens served from the provider's cache."),
            (conventions.USAGE_CACHE_WRITE, "Input tokens written to the provider's cache."),
            (conventions.USAGE_REASONING, "Output tokens used for reasoning."),
        ):
            meter.create_observable_counter(
                name, [self.usage.callback(name)], unit="{token}", description=desc
            )
        self.legacy = _LegacyInstruments(meter) if otel.legacy_names else None

    def observe(self, route: Route, session: str, span: trace.Span, start_ns: int) -> CallObserver:
        """The observer of one call that started at ``start_ns`` (its span already started)."""
        return CallObserver(self, route, session, span, start_ns)


class _LegacyInstruments:
    """The v1.41 metric names, emitted beside the pinned ones on request."""

    def __init__(self, meter: metrics.Meter) -> None:
        seconds = list(conventions.LATENCY_BUCKETS_S)
        self.duration = meter.create_histogram(
            conventions.LEGACY_DURATION, unit="s", explicit_bucket_boundaries_advisory=seconds
        )
        self.ttfc = meter.create_histogram(
            conventions.LEGACY_TIME_TO_FIRST_CHUNK,
            unit="s",
            explicit_bucket_boundaries_advisory=seconds,
        )
        self.tokens = meter.create_histogram(
            conventions.LEGACY_TOKEN_USAGE,
            unit="{token}",
            explicit_bucket_boundaries_advisory=list(conventions.TOKEN_BUCKETS),
        )


@dataclass
class CallObserver:
    """What one call reports; see the module docstring."""

    calls: GenAICalls
    route: Route
    session: str
    span: trace.Span
    start_ns: int
    first_ns: int | None = None
    ttfc_s: float | None = None
    http_status: int | None = None
    raised: BaseException | None = None
    usage: TokenUsage | None = None
    response_id: str | None = None  # the provider's own names for its answer, where it sent
    response_model: str | None = None  # them (read off its first events, _caller.HeadTap)
    routed: Routed | None = None  # a routed step's deployment and failed attempts
    _ended: bool = field(default=False, repr=False)

    def first_chunk(self, time_ns: int, request_time_ns: int) -> None:
        """Ordinal 0 was published and is not an error: the stream started (the span's event).
        The time to first chunk is recorded at the end, for a call that succeeded."""
        self.first_ns = time_ns
        self.ttfc_s = max(time_ns - request_time_ns, 0) / 1e9
        self.calls.models.admit(self.route.model)
        if self.calls.recording:
            self.span.set_attribute("gen_ai.response.time_to_first_chunk", self.ttfc_s)
            self.span.add_event("tokenwire.stream_started", timestamp=time_ns)

    def end(
        self,
        finish: Finish | None,
        error: GatewayError | None,
        chunks: int,
        end_ns: int,
        identity: tuple[int, int] | None,
    ) -> None:
        """The step is over (every chunk acknowledged, or it failed): record and end the span."""
        if self._ended:
            return
        self._ended = True
        error_type = self._error_type(finish, error or self.raised)
        outcome: Outcome = "error" if error_type is not None else "ok"
        if error_type is None and (finish is None or finish.reason == "aborted"):
            outcome = "aborted"
        model = self.calls.models.known(self.route.model)
        provider = self.route.provider
        duration_s = max(end_ns - self.start_ns, 0) / 1e9
        p = self.calls.prometheus
        p.child(p.calls, provider, model, outcome).inc()
        p.child(p.call_duration, provider, model, outcome).observe(duration_s)
        if error_type is not None:
            p.child(p.call_errors, provider, model, error_type).inc()
        ttfc_s = self.ttfc_s if outcome == "ok" else None
        if ttfc_s is not None:
            p.child(p.ttfc, provider, model).observe(ttfc_s)
        gap_s = self._chunk_gap_s(chunks, end_ns) if outcome == "ok" else None
        if gap_s is not None:
            p.child(p.chunk_gap, provider, model).observe(gap_s)
        counts = _token_counts(self.usage)
        for kind, n in zip(_TOKEN_TYPES, counts, strict=True):
            if n:
                p.child(p.tokens, provider, model, kind).inc(n)
        if self.calls.recording:
            self._export(model, error_type, duration_s, (ttfc_s, gap_s), counts)
            self._end_span(finish, error_type, identity, end_ns)

    def _chunk_gap_s(self, chunks: int, end_ns: int) -> float | None:
        if self.first_ns is None or chunks < 2:
            return None
        return max(end_ns - self.first_ns, 0) / 1e9 / (chunks - 1)

    def _error_type(self, finish: Finish | None, error: BaseException | None) -> str | None:
        """``error.type``: the provider's error code (as the telemetry consumer reads it off the
        first chunk), else the HTTP status, else tokenwire's own kind (docs/telemetry.md)."""
        if finish is not None and finish.error is not None:
            code = finish.error.code
            if code:
                return self.calls.error_types.admit(code)
            return str(self.http_status) if self.http_status else conventions.ERROR_OTHER
        if self.http_status is not None:
            return str(self.http_status)
        if error is None or isinstance(error, asyncio.CancelledError):
            return None
        if isinstance(error, BrokerUnavailableError):
            return "tokenwire.broker_unavailable"
        return self.calls.error_types.admit(f"tokenwire.{type(error).__name__}")

    def _metric_attributes(self, model: str) -> dict[str, AttributeValue]:
        address, port = server_of(self.route.url)
        return {
            "gen_ai.operation.name": conventions.OPERATION,
            "gen_ai.provider.name": conventions.genai_provider_name(self.route.provider),
            "gen_ai.request.model": model,
            "server.address": address,
            "server.port": port,
        }

    def _export(
        self,
        model: str,
        error_type: str | None,
        duration_s: float,
        ttfc_and_gap_s: tuple[float | None, float | None],
        counts: tuple[int | None, ...],
    ) -> None:
        attributes = self._metric_attributes(model)
        if error_type is not None:
            attributes["error.type"] = error_type
        ttfc_s, gap_s = ttfc_and_gap_s
        legacy = self.calls.legacy
        self.calls.duration.record(duration_s, attributes)
        if ttfc_s is not None:
            self.calls.ttfc.record(ttfc_s, attributes)
        if gap_s is not None:
            self.calls.chunk_gap.record(gap_s, attributes)
        if legacy is not None:
            legacy.duration.record(duration_s, attributes)
            if ttfc_s is not None:
                legacy.ttfc.record(ttfc_s, attributes)
        if self.usage is None:
            return
        key = tuple(attributes.items())
        for name, n in zip(_USAGE_METRICS, _convention_counts(counts), strict=True):
            if n is not None:
                self.calls.usage.add(name, key, n)
        if legacy is not None:
            inputs, outputs = _convention_counts(counts)[:2]
            for kind, n in (("input", inputs), ("output", outputs)):
                if n is not None:
                    legacy.tokens.record(n, {**attributes, "gen_ai.token.type": kind})

    def _end_span(
        self,
        finish: Finish | None,
        error_type: str | None,
        identity: tuple[int, int] | None,
        end_ns: int,
    ) -> None:
        span = self.span
        if identity is not None:
            span.set_attributes({"tokenwire.turn": identity[0], "tokenwire.step": identity[1]})
        if finish is not None:
            span.set_attribute("gen_ai.response.finish_reasons", [finish.reason])
        if self.response_id is not None:
            span.set_attribute("gen_ai.response.id", self.response_id)
        if self.response_model is not None:
            span.set_attribute("gen_ai.response.model", self.response_model)
        if self.routed is not None:
            _route_attributes(span, self.routed)
        counts = _convention_counts(_token_counts(self.usage))
        for name, n in zip(_SPAN_USAGE, counts, strict=True):
            if n is not None:
                span.set_attribute(name, n)
        if error_type is not None:
            span.set_attribute("error.type", error_type)
            span.set_status(trace.Status(trace.StatusCode.ERROR))
        span.end(end_time=end_ns)


class UsageTotals:
    """The token counters' running totals, read by the SDK's observable counters at export.

    Adding to a dict costs a fraction of an SDK counter's ``add`` (which hashes and cleans the
    attributes on every call, bench/bench_observability.py); the totals are cumulative, as the
    counters' are. The keys are bounded by the bounded label values.
    """

    def __init__(self) -> None:
        self.totals: dict[tuple[str, tuple[tuple[str, AttributeValue], ...]], int] = {}

    def add(self, name: str, key: tuple[tuple[str, AttributeValue], ...], n: int) -> None:
        """Add ``n`` tokens to the total of metric ``name`` with attributes ``key``."""
        self.totals[name, key] = self.totals.get((name, key), 0) + n

    def callback(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        """The observable counter's callback for metric ``name``."""

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            for (metric, key), total in list(self.totals.items()):  # a copy: the loop adds
                if metric == name:
                    yield Observation(total, {**dict(key), "gen_ai.token.modality": "unknown"})

        return observe


_USAGE_METRICS = (
    conventions.USAGE_INPUT,
    conventions.USAGE_OUTPUT,
    conventions.USAGE_CACHE_READ,
    conventions.USAGE_CACHE_WRITE,
    conventions.USAGE_REASONING,
)
_SPAN_USAGE = (
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.usage.cache_write.input_tokens",
    "gen_ai.usage.reasoning.output_tokens",
)


def _token_counts(usage: TokenUsage | None) -> tuple[int | None, ...]:
    """tokenwire's disjoint counts: input, output, cache read, cache write, reasoning."""
    if usage is None:
        return (None,) * 5
    return (
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_tokens,
        usage.cache_write_tokens,
        usage.reasoning_tokens,
    )


def _convention_counts(counts: tuple[int | None, ...]) -> tuple[int | None, ...]:
    """The conventions' counts: input includes cached tokens, output includes reasoning."""
    inputs, outputs, cache_read, cache_write, reasoning = counts
    total_in = _sum(inputs, cache_read, cache_write)
    total_out = _sum(outputs, reasoning)
    return total_in, total_out, cache_read, cache_write, reasoning


def _sum(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _route_attributes(span: trace.Span, routed: Routed) -> None:
    """A routed step's public name, the deployment that served it, and each attempt that
    failed before it as an event (deployment names come from the routes file: bounded)."""
    span.set_attributes(
        {
            "tokenwire.route": routed.route,
            "tokenwire.deployment": routed.deployment,
            "tokenwire.attempts": len(routed.attempts) + 1,
        }
    )
    for attempt in routed.attempts:
        attributes: dict[str, AttributeValue] = {
            "tokenwire.deployment": attempt.deployment,
            "tokenwire.failure": attempt.failure,
        }
        if attempt.status is not None:
            attributes["http.response.status_code"] = attempt.status
        span.add_event("tokenwire.attempt_failed", attributes)


def call_span_attributes(route: Route, session: str) -> dict[str, AttributeValue]:
    """The attributes known when the call starts (no content, ever)."""
    address, port = server_of(route.url)
    return {
        "gen_ai.operation.name": conventions.OPERATION,
        "gen_ai.provider.name": conventions.genai_provider_name(route.provider),
        "gen_ai.request.model": route.model,
        "gen_ai.request.stream": True,
        "gen_ai.conversation.id": session,
        "server.address": address,
        "server.port": port,
        "tokenwire.session": session,
        "tokenwire.provider": route.provider,
    }
