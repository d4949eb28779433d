"""The telemetry consumer starts against a comma-separated URL list (docker-compose's form),
through the shared broker connect (before, nats-py refused it: invalid connect url option)."""

from __future__ import annotations

import asyncio

from tests.fixtures.broker import drop_topology, fresh_topology
from tokenwire.broker import connect, free_port
from tokenwire.broker._api import inbox_prefix
from tokenwire.services.telemetry._run import TelemetrySettings, run


async def test_a_comma_separated_url_list_starts_the_consumer(nats_url: str) -> None:
    topology = fresh_topology()
    settings = TelemetrySettings(
        nats_url=f"{nats_url},{nats_url}", topology=topology, metrics_port=free_port()
    )
    try:
        await asyncio.wait_for(run(settings, burst=True), 60)  # provisions, drains, returns
    finally:
        nc = await connect(nats_url)
        await drop_topology(nc, topology)
        await nc.close()


def test_the_inbox_prefix_follows_the_user_in_the_url() -> None:
    assert inbox_prefix(["nats://telemetry:pw@a:1", "nats://telemetry:pw@b:2"]) == (
        "_INBOX.telemetry"
    )
    assert inbox_prefix(["nats://127.0.0.1:4222"]) == "_INBOX"
