"""A running assembler whose membership bucket and partition consumers the broker lost
(deleted under it) creates them again and then stores every step published to the
re-created consumers; a lost chunk stream it may not create (it does not provision) makes
it not ready, naming what is missing (issue 48)."""

from __future__ import annotations

from nats.aio.client import Client

from tests.assembler.harness import check_store, eventually, make_plan, publish_plan, settings_for
from tokenwire.broker import Topology, connect
from tokenwire.broker._api import api_request
from tokenwire.services.assembler import Assembler
from tokenwire.store import open_store


async def test_a_lost_bucket_and_lost_consumers_come_back(
    nc: Client, nats_url: str, topology: Topology, sqlite_url: str
) -> None:
    store = open_store(sqlite_url)
    own = await connect(nats_url)
    settings = settings_for(
        nats_url, topology, sqlite_url, burst=False, heartbeat_s=0.2, member_ttl_s=1.0
    )
    assembler = Assembler(settings, own, store)

    async def restored() -> bool:
        count = assembler.metrics.registry.get_sample_value
        kinds = ("members", "consumer")
        return (
            all((count("tokenwire_assembler_restored_total", {"kind": k}) or 0) >= 1 for k in kinds)
            and assembler.ready
        )

    try:
        await assembler.start()
        await eventually(lambda: _true(assembler.ready), what="ready")
        await api_request(nc, f"$JS.API.STREAM.DELETE.KV_{topology.members_bucket}")
        for p in range(topology.partitions):
            stream, name = topology.stream_of_partition(p), topology.assembler_consumer(p)
            await api_request(nc, f"$JS.API.CONSUMER.DELETE.{stream}.{name}")
        await eventually(restored, what="the bucket and the consumers created again")
        plan = make_plan(seed=48, sessions=6, turns=2)
        await publish_plan(nc, topology, plan)

        async def stored() -> bool:
            counts = [len(await store.messages(s)) for s in plan.steps]
            return counts == [2] * len(plan.steps)

        await eventually(stored, what="every step stored")
        await check_store(store, plan)
        # a stream is the provisioner's: one that vanished stays missing, and says so
        await api_request(nc, f"$JS.API.STREAM.DELETE.{topology.stream}")

        async def says_missing() -> bool:
            return "missing" in assembler.readiness().reasons

        await eventually(says_missing, what="not ready: missing")
        assert f"{topology.assembler_consumer(0)}" in assembler.readiness().body()
    finally:
        await assembler.close()
        await own.close()
        await store.close()


async def _true(value: bool) -> bool:
    return value
