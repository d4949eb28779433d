"""Readiness on a real broker (issue 48): an instance that holds no partition while chunks
wait on one nobody holds says so (``unowned``), as the broker restart of the issue left it
(its membership unreadable, its pins gone, no standby pull); a membership that stays
unreadable past the member TTL makes it stand by everywhere, so the partitions come back."""

from __future__ import annotations

from typing import cast

from nats.aio.client import Client

from tests.assembler.harness import eventually, publish_one, settings_for
from tests.assembler.scripts import envelopes, text_step
from tokenwire.broker import ChunkPublisher, Restored, Topology, connect, partition_of
from tokenwire.broker._api import api_request
from tokenwire.services.assembler import Assembler
from tokenwire.services.assembler._consume import PartitionSet
from tokenwire.services.assembler._members import MemberBoard
from tokenwire.services.assembler._metrics import AssemblerMetrics
from tokenwire.services.assembler._rebalance import Rebalancer
from tokenwire.store import open_store


async def test_an_instance_holding_nothing_while_chunks_wait_unowned_is_not_ready(
    nc: Client, nats_url: str, topology: Topology, sqlite_url: str
) -> None:
    store = open_store(sqlite_url)
    own = await connect(nats_url)
    settings = settings_for(nats_url, topology, sqlite_url, burst=False, member_ttl_s=60.0)
    assembler = Assembler(settings, own, store)
    publisher = await ChunkPublisher(nc, topology).start()

    async def refused() -> Restored:  # a user that may not create the bucket
        return "failed"

    try:
        await assembler.start()
        envs = envelopes("waits", 0, 0, text_step(["a"]))
        await publish_one(publisher, envs[0])
        consumer = assembler.partitions.consumers[partition_of("waits", topology.partitions)]
        await eventually(lambda: _true(consumer.pin_id is not None), what="pinned")
        assembler.restorer.members = lambda member_ttl_s: refused()  # type: ignore[method-assign]  # the seam
        await api_request(nc, f"$JS.API.STREAM.DELETE.KV_{topology.members_bucket}")
        for c in assembler.partitions.consumers.values():  # as a broker restart drops pins
            c.offering = False
            await c.release()
            c.resume()
        for env in envs[1:]:
            await publish_one(publisher, env)

        value = assembler.metrics.registry.get_sample_value
        seen: list[tuple[bool, str]] = []

        async def says_unowned() -> bool:
            # Everything read in one turn of the loop, so the probe, the reasons and the
            # gauges are one state (the instance may take its partitions back later: ADR 0045).
            readiness = assembler.readiness()
            states = (
                "unowned" in readiness.reasons,
                not assembler.partitions.owned(),
                value("tokenwire_assembler_not_ready", {"reason": "unowned"}) == 1.0,
                value("tokenwire_assembler_unowned_partitions") == 1.0,
                value("tokenwire_assembler_ready") == 0.0,
            )
            if all(states):
                seen.append(assembler.probe())
            return all(states)

        await eventually(says_unowned, what="not ready: unowned, one partition unowned")
        ready, body = seen[-1]
        assert ready is False
        assert body.startswith(f"not ready: owns 0 of {topology.partitions} partitions; ")
    finally:
        await assembler.close()
        await own.close()
        await store.close()
        await publisher.close()


class _Consumer:
    offering = False


class _Partitions:
    def __init__(self) -> None:
        self.consumers = {p: _Consumer() for p in range(4)}

    def pins(self) -> dict[int, str]:
        return {}

    def healthy(self) -> bool:
        return True


class _Unreadable:
    async def read(self) -> None:
        return None


class _Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_an_unreadable_membership_past_the_ttl_stands_by_everywhere() -> None:
    clock = _Clock()
    partitions = _Partitions()

    async def hand_over(partition: int) -> None:
        raise AssertionError("nothing to hand over")

    rebalancer = Rebalancer(
        cast(MemberBoard, _Unreadable()),  # twins of the board and the partition set
        cast(PartitionSet, partitions),
        "me",
        4,
        AssemblerMetrics(),
        in_flight=lambda p: 0,
        hand_over=hand_over,
        hold_s=6.0,
        clock=clock,
    )
    rebalancer._note_view(frozenset({"me", "other"}))  # a view, last read at 100 s
    rebalancer.read_ok_at = 100.0
    clock.now = 105.0
    await rebalancer.round()
    assert not any(c.offering for c in partitions.consumers.values())  # within the TTL: wait
    clock.now = 106.5
    await rebalancer.round()
    assert all(c.offering for c in partitions.consumers.values())  # past it: stand by


async def _true(value: bool) -> bool:
    return value
