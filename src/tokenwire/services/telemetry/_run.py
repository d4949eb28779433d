"""``tokenwire telemetry``: one telemetry consumer process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

from tokenwire.broker import Topology, check_layout, connect, ensure_topology, publish_event
from tokenwire.observability import ProbeServer, otel_from_env, probe_app
from tokenwire.services.telemetry._otel import OtelSignals
from tokenwire.services.telemetry._prometheus import TelemetryMetrics
from tokenwire.services.telemetry._service import TelemetryConsumer
from tokenwire.variables import PROVISION, TELEMETRY_METRICS_ADDR

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TelemetrySettings:
    """Where to consume from and where to serve ``/metrics``, ``/healthz`` and ``/readyz``."""

    nats_url: str
    topology: Topology = field(default_factory=Topology)
    metrics_host: str = TELEMETRY_METRICS_ADDR.value[0]
    metrics_port: int = TELEMETRY_METRICS_ADDR.value[1]
    provision: bool = PROVISION.value


async def run(
    settings: TelemetrySettings, stop: asyncio.Event | None = None, burst: bool = False
) -> None:
    """Consume first chunks until ``stop`` is set (or until caught up, with ``burst``)."""
    stop = stop or asyncio.Event()
    metrics = TelemetryMetrics()
    nc = await connect(settings.nats_url, name="tokenwire-telemetry", stop=stop)  # bounded
    otel = otel_from_env("tokenwire-telemetry")  # OTLP export only when an endpoint is set
    t = settings.topology
    consumer = TelemetryConsumer(
        nc=nc,
        topology=t,
        metrics=metrics,
        otel=OtelSignals(otel.tracer_provider) if otel.sdk else None,
        live=lambda subject, payload: publish_event(nc, subject, payload),
        reprovision=(lambda: ensure_topology(nc, t)) if settings.provision else None,
    )
    server = ProbeServer(
        settings.metrics_host, settings.metrics_port, probe_app(metrics.registry, consumer.probe)
    )
    try:
        if settings.provision:
            await ensure_topology(nc, t)
        else:
            await check_layout(nc, t)
        log.info("telemetry consuming %s on %s", t.first_chunks_filter, ", ".join(t.chunk_streams))
        await consumer.run(stop, burst=burst)
    finally:
        # Closed, not drained: the consumers' stop already let their handlers finish and
        # handed back what they held, and a drain waits for a broker that may not answer
        # (30 s, then a 10 s flush: the stop bound's to keep).
        with contextlib.suppress(OSError):
            await nc.close()
        otel.shutdown()
        server.close()
