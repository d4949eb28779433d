"""A standby assembler (ready, nothing to commit yet) exports ``store_up 1``, not 0."""

from __future__ import annotations

from nats.aio.client import Client

from tests.assembler.harness import settings_for
from tokenwire.broker import Topology, connect
from tokenwire.services.assembler import Assembler
from tokenwire.store import open_store


async def test_a_ready_standby_reports_the_store_up(
    nc: Client, nats_url: str, topology: Topology, sqlite_url: str
) -> None:
    store = open_store(sqlite_url)
    own = await connect(nats_url)
    assembler = Assembler(settings_for(nats_url, topology, sqlite_url, burst=False), own, store)
    try:
        await assembler.start()  # nothing published: it never commits
        assert assembler.ready
        up = assembler.metrics.registry.get_sample_value("tokenwire_assembler_store_up")
        assert up == 1.0
    finally:
        await assembler.close()
        await own.close()
        await store.close()
