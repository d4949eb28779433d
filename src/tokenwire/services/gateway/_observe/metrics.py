"""Prometheus metrics of one gateway app, in a registry of its own (several apps per process
in tests never collide). Labels never carry content, session ids or credentials."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from tokenwire.observability.conventions import CHUNK_GAP_BUCKETS_S, LATENCY_BUCKETS_S
from tokenwire.replay import SseStats
from tokenwire.services.gateway._observe.ready import REASONS

_M = TypeVar("_M", Counter, Histogram)
_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class GatewayMetrics:
    """The gateway's counters, gauges and histograms."""

    def __init__(self, window_in_use: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "tokenwire_gateway_requests",
            "HTTP requests by route and status.",
            ["route", "status"],
            registry=r,
        )
        self.chunks = Counter(
            "tokenwire_gateway_chunks_published",
            "Chunks handed to the broker publisher.",
            ["provider"],
            registry=r,
        )
        self.ack_latency = Histogram(
            "tokenwire_gateway_publish_ack_seconds",
            "From a step's last publish until every chunk of it was acknowledged.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.steps = Counter(
            "tokenwire_gateway_steps", "Steps by finish reason.", ["finish_reason"], registry=r
        )
        self.threads = Counter(
            "tokenwire_gateway_session_matches",
            "Model calls by how their session was found (tool-call-id, previous-response, "
            "content, new, header).",
            ["match"],
            registry=r,
        )
        self.in_flight = Gauge(
            "tokenwire_gateway_streams_in_flight", "Steps reading a provider now.", registry=r
        )
        self.ttfc = Histogram(
            "tokenwire_gateway_time_to_first_chunk_seconds",
            "Successful calls: from receiving the request to the first chunk (docs/telemetry.md).",
            ["provider", "model"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.calls = Counter(
            "tokenwire_gateway_calls",
            "Model calls by outcome (ok, error, aborted).",
            ["provider", "model", "outcome"],
            registry=r,
        )
        self.call_errors = Counter(
            "tokenwire_gateway_call_errors",
            "Failed model calls by error.type.",
            ["provider", "model", "error_type"],
            registry=r,
        )
        self.call_duration = Histogram(
            "tokenwire_gateway_call_duration_seconds",
            "From the provider request to the step's last chunk acknowledged.",
            ["provider", "model", "outcome"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.chunk_gap = Histogram(
            "tokenwire_gateway_time_per_output_chunk_seconds",
            "Successful calls: mean time between chunks after the first, one sample per call.",
            ["provider", "model"],
            buckets=CHUNK_GAP_BUCKETS_S,
            registry=r,
        )
        self.tokens = Counter(
            "tokenwire_gateway_tokens",
            "Tokens reported by providers, by disjoint type (input, output, cache_read, "
            "cache_write, reasoning).",
            ["provider", "model", "type"],
            registry=r,
        )
        self.deployment_calls = Counter(
            "tokenwire_gateway_deployment_calls",
            "Calls to routed deployments before their first byte, by outcome (ok, or why it "
            "failed: connect, timeout, rate-limited, server-error, overloaded, untranslatable).",
            ["route", "deployment", "outcome"],
            registry=r,
        )
        self.fallbacks = Counter(
            "tokenwire_gateway_fallbacks",
            "Routed steps that were served by another deployment than the one first tried.",
            ["route"],
            registry=r,
        )
        self.route_unavailable = Counter(
            "tokenwire_gateway_route_unavailable",
            "Requests answered 429 because every deployment of the name and its fallbacks "
            "was cooling down or at capacity.",
            ["route"],
            registry=r,
        )
        self._deployment_calls: dict[tuple[str, str, str], Counter] = {}
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.limit_refusals = Counter(
            "tokenwire_gateway_limit_refusals",
            "Calls refused by a key's or tenant's limit: kind rpm, tpm, concurrent or budget; "
            "scope key or tenant (names are in `tokenwire limits`, never labels).",
            ["kind", "scope"],
            registry=r,
        )
        self.limit_trips = Histogram(
            "tokenwire_gateway_limit_broker_seconds",
            "Admissions that asked the broker for a larger lease, by how long that took.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._deployments = _DeploymentCollector()
        r.register(self._deployments)
        window = Gauge(
            "tokenwire_gateway_publisher_window_in_use",
            "Chunks published and not yet acknowledged.",
            registry=r,
        )
        window.set_function(window_in_use)
        self.ready = Gauge(
            "tokenwire_gateway_ready",
            "1 when the gateway can capture steps (/readyz 200).",
            registry=r,
        )
        self.not_ready = Gauge(
            "tokenwire_gateway_not_ready",
            "1 for each reason the gateway is not ready (docs/gateway.md, Readiness).",
            ["reason"],
            registry=r,
        )
        self._readers = _ReaderCollector(SseStats())  # zeros until watch_readers()
        r.register(self._readers)

    def child(self, metric: _M, *values: str) -> _M:
        """``metric.labels(*values)``, kept: the same child prometheus_client returns, without
        its checks and lock on every call (a step makes several). The values are bounded sets
        (providers, bounded model and error labels, outcomes), and no child is ever removed."""
        key = (id(metric), values)
        found: _M | None = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*values)
        return found

    def deployment_call(self, route: str, deployment: str, outcome: str) -> None:
        """Count one call to a routed deployment (the labelled child kept: a lookup in
        Prometheus' own table costs several microseconds on the step's path)."""
        key = (route, deployment, outcome)
        child = self._deployment_calls.get(key)
        if child is None:
            child = self._deployment_calls[key] = self.deployment_calls.labels(*key)
        child.inc()

    def limit_refused(self, kind: str, scope: str) -> None:
        """One call refused by a ``kind`` limit of a ``scope`` (key, tenant)."""
        self.limit_refusals.labels(kind, scope).inc()

    def limit_trip(self, seconds: float) -> None:
        """One admission waited ``seconds`` on the broker for its lease."""
        self.limit_trips.observe(seconds)

    def watch_deployments(self, view: DeploymentView) -> None:
        """Expose the routed deployments' state and load as this gateway sees them."""
        self._deployments.view = view

    def watch_readers(self, stats: SseStats) -> None:
        """Expose these session event readers' counters (``GET /v1/sessions/{s}/events``)."""
        self._readers.stats = stats

    def readiness(self, reasons: tuple[str, ...]) -> None:
        """Export a readiness verdict (every reason of ``_ready.REASONS`` set, 1 or 0)."""
        self.ready.set(0 if reasons else 1)
        for reason in REASONS:
            self.not_ready.labels(reason).set(1 if reason in reasons else 0)

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)


class DeploymentView(Protocol):
    """What the deployments' collector reads at each scrape (the app's routes and health)."""

    def deployment_states(self) -> list[tuple[str, str, int]]:
        """(deployment, state, requests in flight) for every deployment of the routes in
        force; state is ``ok``, ``cooling``, ``probe``, ``probing`` or ``busy``."""
        ...

    def routes_reloads(self) -> tuple[int, int]:
        """Reloads of the routes file that took effect, and that were refused."""
        ...


_STATES = ("ok", "cooling", "probe", "probing", "busy")


class _DeploymentCollector(Collector):
    """The routed deployments' state and load, read at each scrape (bounded labels: the
    deployment names of the routes file in force)."""

    def __init__(self) -> None:
        self.view: DeploymentView | None = None

    def collect(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "tokenwire_gateway_deployment_state",
            "1 for each routed deployment's state as this gateway sees it (ok, cooling, "
            "probe: due for its one probe, probing: another gateway's probe, busy: at rpm/tpm).",
            labels=["deployment", "state"],
        )
        in_flight = GaugeMetricFamily(
            "tokenwire_gateway_deployment_in_flight",
            "Requests this gateway has on their way to each routed deployment.",
            labels=["deployment"],
        )
        reloads = CounterMetricFamily(
            "tokenwire_gateway_routes_reloads",
            "Routes file reloads: applied, or refused (the routes in force stay).",
            labels=["outcome"],
        )
        if self.view is not None:
            for name, current, flying in self.view.deployment_states():
                for kind in _STATES:
                    state.add_metric([name, kind], 1.0 if kind == current else 0.0)
                in_flight.add_metric([name], flying)
            applied, refused = self.view.routes_reloads()
            reloads.add_metric(["applied"], applied)
            reloads.add_metric(["refused"], refused)
        yield state
        yield in_flight
        yield reloads


class _ReaderCollector(Collector):
    """The events endpoint's :class:`SseStats`, read at each scrape."""

    def __init__(self, stats: SseStats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        yield GaugeMetricFamily(
            "tokenwire_gateway_readers_open",
            "Session event streams open now (each holds one bounded broker read).",
            value=s.clients,
        )
        for name, value, meaning in (
            ("readers_refused", s.refused, "Event streams refused with 503 at the reader cap."),
            ("reader_events", s.events, "Session events sent to event stream clients."),
            ("reader_events_coalesced", s.coalesced, "Events merged because a client was behind."),
            ("reader_pauses", s.pauses, "Broker reads paused until a client drained its queue."),
            ("readers_lagged", s.lagged, "Event streams ended with `lagged` (client too slow)."),
        ):
            yield CounterMetricFamily(f"tokenwire_gateway_{name}", meaning, value=value)
