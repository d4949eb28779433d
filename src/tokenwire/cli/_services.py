"""One service per command, configured by environment, for compose and Kubernetes."""

from __future__ import annotations

import asyncio
import os
import time

import click

from tokenwire.broker import Connection, Topology
from tokenwire.cli._common import (
    nats_url,
    settings,
    topology,
)
from tokenwire.cli._flags import variable_flags
from tokenwire.cli._running import event_loop_factory, run_until_signal, unless_stopped
from tokenwire.variables import TELEMETRY_METRICS_ADDR


@click.command()
@click.option("--burst", is_flag=True, help="Drain what is pending, then exit.")
@variable_flags("telemetry")
@click.pass_context
def telemetry(ctx: click.Context, burst: bool) -> None:
    """Run the telemetry consumer (stream-started signals, OpenTelemetry, Prometheus)."""
    from tokenwire.services import telemetry as service

    s = settings(ctx)
    host, port = TELEMETRY_METRICS_ADDR.read(os.environ)
    config = service.TelemetrySettings(
        nats_url=nats_url(s, service=True),
        topology=topology(s),
        metrics_host=host,
        metrics_port=port,
        provision=s.provision,
    )

    async def main(stop: asyncio.Event) -> None:
        await service.run(config, stop, burst=burst)

    run_until_signal(main)


@click.command()
@variable_flags("gateway")
def gateway() -> None:
    """Run the provider gateway (configured by TOKENWIRE_GATEWAY_* and TOKENWIRE_NATS_URL).

    SIGINT/SIGTERM: stop accepting, let in-flight steps finish and flush the publisher, all
    within TOKENWIRE_STOP_TIMEOUT_S; exit 130/143.
    """
    from tokenwire.services import gateway as service

    config = service.GatewaySettings.from_env()
    service.tune_gc()

    async def main(stop: asyncio.Event) -> None:
        await service.run(config, stop)

    run_until_signal(main, loop_factory=event_loop_factory())


@click.command()
@click.option(
    "--timeout",
    "timeout_s",
    default=60.0,
    show_default=True,
    help="How long to retry while a cluster elects its meta leader.",
)
@variable_flags("provision")
@click.pass_context
def provision(ctx: click.Context, timeout_s: float) -> None:
    """Create or update the streams, KV bucket and consumers (idempotent).

    Run once before services that start with TOKENWIRE_PROVISION=0 under NATS users that may
    not change the topology (compose's provision service, the Kubernetes Job).
    """
    from tokenwire.broker import connect

    s = settings(ctx)
    t = topology(s)
    url = nats_url(s, service=True)

    async def main(stop: asyncio.Event) -> None:
        nc = await unless_stopped(connect(url, name="tokenwire-provision"), stop)
        try:
            await _retry_topology(nc, t, timeout_s, stop)
        finally:
            await nc.close()
        streams = ", ".join(t.chunk_streams)
        click.echo(
            f"provision: {streams} ({t.partitions} partitions over {t.shards} shard"
            f"{'s' if t.shards > 1 else ''}, {t.replicas} replicas) ready"
        )
        click.echo(f"provision: step registry {', '.join(t.registry_buckets)} ready")
        click.echo(f"provision: events {', '.join(t.events_streams)} ready")

    run_until_signal(main)


@click.command()
@variable_flags("reshard")
@click.pass_context
def reshard(ctx: click.Context) -> None:
    """Switch the broker to TOKENWIRE_SHARDS / TOKENWIRE_PARTITIONS (docs/operations.md).

    Refuses (exit 1, nothing changed) unless every durable consumer of the current layout is
    drained. Retires the current layout's streams (their data stays readable by replay,
    verify and rebuild until it ages out) and provisions the new layout. Idempotent.
    """
    from tokenwire.broker import connect, reshard

    s = settings(ctx)
    t = topology(s)
    url = nats_url(s, service=True)

    async def main(stop: asyncio.Event) -> None:
        nc = await unless_stopped(connect(url, name="tokenwire-reshard"), stop)
        try:
            old, retired = await unless_stopped(reshard(nc, t), stop)
        finally:
            await nc.close()
        before = old.layout if old is not None else "none"
        click.echo(f"reshard: {before} -> {t.layout}; retired {', '.join(retired) or 'nothing'}")
        click.echo(f"reshard: {', '.join(t.chunk_streams)} ready")

    run_until_signal(main)


async def _retry_topology(
    nc: Connection, t: Topology, timeout_s: float, stop: asyncio.Event
) -> None:
    from tokenwire.broker import TopologyError, ensure_topology

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await ensure_topology(nc, t)
            return
        except TopologyError:  # LayoutConflict is not one: it fails at once
            # Right after the nodes start JetStream answers "no suitable peers" (or nothing)
            # until a meta leader exists; past the deadline the refusal is real.
            if time.monotonic() > deadline or stop.is_set():
                raise
            await asyncio.sleep(1.0)


@click.command()
@variable_flags("assembler")
def assembler() -> None:
    """Run one assembler instance (configured by TOKENWIRE_ASSEMBLER_* and the shared variables).

    SIGINT/SIGTERM: stop pulling, commit what closed, hand back what is open, all within
    TOKENWIRE_STOP_TIMEOUT_S; exit 130/143.
    """
    from tokenwire.services import assembler as service

    config = service.AssemblerSettings.from_env()

    async def main(stop: asyncio.Event) -> None:
        await service.run(config, stop)

    run_until_signal(main)
