"""The membership bucket under the committed NATS users (deploy/nats/accounts.conf): the
provisioner creates it, the assembler user beats, reads and leaves with no violation, and may
not purge it (ADR 0016)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.deploy._nats import Node, NodePorts, close, connect_as, provision, running
from tests.deploy.test_nats_config import _denied, _single_node_config
from tokenwire.broker import Topology, free_port
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
