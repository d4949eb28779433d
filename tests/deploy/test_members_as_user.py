"""The membership bucket under the committed NATS users (deploy/nats/accounts.conf): the
provisioner creates it, the assembler user beats, reads and leaves with no violation, and may
not purge it (ADR 0016)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tests.deploy._nats import Node, NodePorts, close, connect_as, provision, running
from tests.deploy.test_nats_config import _denied, _single_node_config
from tokenwire.broker import Restorer, Topology, free_port
from tokenwire.broker._api import api_request
from tokenwire.broker._provision import ensure_stream, shard_stream_config
from tokenwire.services.assembler._members import MemberBoard, MemberRecord


@pytest.mark.slow
async def test_the_assembler_user_keeps_its_membership_without_violations(tmp_path: Path) -> None:
    port = free_port()
    node = Node(_single_node_config(tmp_path, port), NodePorts(port, 0, 0), "single")
    with running([node]):
        provision(node.url("provisioner"), replicas=1)
        topology = Topology()
        conns = [await connect_as("assembler", node.url("assembler")) for _ in range(2)]
        try:
            boards = [MemberBoard(c.nc, topology) for c in conns]
            assert await boards[0].beat(MemberRecord("a", share=8, pins={0: "x"}))
            assert await boards[1].beat(MemberRecord("b", share=8))
            members = await boards[0].read()
            assert members is not None
            assert {n: r.owned for n, r in members.items()} == {"a": 1, "b": 0}
            await boards[1].leave("b")
            assert set(await boards[0].read() or {}) == {"a"}
            assert [c.violations() for c in conns] == [[], []]
            await _denied(conns[0], f"$JS.API.STREAM.PURGE.KV_{topology.members_bucket}")
        finally:
            for conn in conns:
                await close(conn)


@pytest.mark.slow
async def test_the_services_may_create_again_what_only_they_use(tmp_path: Path) -> None:
    """Issue 48: under the committed users, the assembler creates its membership bucket and a
    partition consumer again, the telemetry user its consumer, when the broker lost them; a
    durable of another service stays out of reach."""
    port = free_port()
    node = Node(_single_node_config(tmp_path, port), NodePorts(port, 0, 0), "single")
    with running([node]):
        provision(node.url("provisioner"), replicas=1)
        topology = Topology()
        users = ("provisioner", "assembler", "telemetry")
        conns = {u: await connect_as(u, node.url(u)) for u in users}
        try:
            bucket = f"KV_{topology.members_bucket}"
            await api_request(conns["provisioner"].nc, f"$JS.API.STREAM.DELETE.{bucket}")
            board = MemberBoard(
                conns["assembler"].nc,
                topology,
                restore=lambda: Restorer(conns["assembler"].nc, topology).members(6.0),
            )
            assert await board.beat(MemberRecord("a"))  # the bucket is back, the beat stored
            # a stream of the same names elsewhere: the users' creates, proved on it
            other = dataclasses.replace(topology, stream="TOKENWIRE_RESTORE", prefix="twr")
            await ensure_stream(conns["provisioner"].nc, shard_stream_config(other, 0))
            restore: dict[str, Any] = {
                "ack_wait_s": 30.0,
                "max_deliver": 10,
                "priority_timeout_s": 5.0,
            }
            as_assembler = Restorer(conns["assembler"].nc, other)
            assert await as_assembler.assembler_consumer(3, **restore) == "restored"
            assert await as_assembler.telemetry_consumer(other.stream) == "failed"  # not its
            as_telemetry = Restorer(conns["telemetry"].nc, other)
            assert await as_telemetry.telemetry_consumer(other.stream) == "restored"
            assert await as_telemetry.assembler_consumer(4, **restore) == "failed"
            assert conns["assembler"].violations()  # the refused create, and nothing else:
            assert all("telemetry" in v for v in conns["assembler"].violations())
            assert all("assembler-p4" in v for v in conns["telemetry"].violations())
        finally:
            for conn in conns.values():
                await close(conn)
