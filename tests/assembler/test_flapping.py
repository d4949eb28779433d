"""A member that flaps (stops pulling for less than the priority timeout, again and again) does
not make ownership oscillate: pins stay where they are, and the shares stay balanced.

Two assembler processes share 16 partitions on a real nats-server; one is frozen with SIGSTOP
for a fraction of the priority timeout, six times. The server's pins (not the instances'
beliefs) are sampled throughout.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.assembler.elastic import (
    MEMBER_TTL_S,
    PRIORITY_TIMEOUT_S,
    pinned_ids,
    start_assembler,
    stop_all,
    wait_for,
    wait_for_shares,
)
from tests.assembler.elastic_load import PARTITIONS, filler_plan, publish_filler
from tests.assembler.harness import check_store
from tests.assembler.test_failover import wait_until_settled
from tests.fixtures.broker import close_client
from tokenwire.broker import ChunkPublisher, EmbeddedServer, Topology, connect, ensure_topology
from tokenwire.cli._status import _print as print_status
from tokenwire.cli._status import _status as status_report
from tokenwire.store import open_store

FLAPS = 6
FROZEN_S = PRIORITY_TIMEOUT_S / 4
"""Each freeze: well below the priority timeout (the pin survives it) and the member TTL."""
MAX_MOVES = PARTITIONS // 2
"""At most one partition move per partition of the flapping member's share, over all flaps
(a freeze stretched by a loaded machine may cost its pins once; they must not keep moving)."""


async def check_status(nats_url: str, store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``tokenwire status`` names each partition's owner and the members' shares (heartbeats
    lag the pins by up to one period: polled until they agree, bounded)."""
    report: dict[str, Any] = {}

    def shares() -> dict[str, tuple[int, int]]:
        return {m["name"]: (m["share"], len(m["owned"])) for m in report["members"]}

    def owners() -> dict[int, str | None]:
        return {
            int(c["name"].removeprefix("assembler-p")): c["owner_member"]
            for c in report["consumers"]
            if c["name"].startswith("assembler-p")
        }

    async def agrees() -> bool:
        nonlocal report
        report = await status_report(nats_url, store_url)
        owned = {p: m["name"] for m in report["members"] for p in m["owned"]}
        return shares() == {"a": (8, 8), "b": (8, 8)} and owners() == owned

    async def what() -> str:
        return f"shares {shares()}, owners {owners()}"

    await wait_for(agrees, 20.0, what)
    capsys.readouterr()
    print_status(report)
    out = capsys.readouterr().out
    assert "member a" in out
    assert "share   8  owns   8" in out
    assert "owner a" in out
    assert "owner b" in out


@pytest.mark.slow
async def test_a_flapping_member_does_not_make_ownership_oscillate(
    tmp_path: Path, sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    topology = Topology(partitions=PARTITIONS)  # the processes' default names: own server
    filler = filler_plan(seed=23, turns=600)
    server = EmbeddedServer(tmp_path / "nats").start()
    nats_url = server.url
    nc = await connect(nats_url)
    store = open_store(sqlite_url)
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        await ensure_topology(
            nc,
            topology,
            ack_wait_s=5.0,
            priority_timeout_s=PRIORITY_TIMEOUT_S,
            member_ttl_s=MEMBER_TTL_S,
        )
        publisher = await ChunkPublisher(nc, topology).start()
        stop = asyncio.Event()
        publishing = asyncio.create_task(publish_filler(publisher, filler, stop))
        for member in "ab":
            procs[member] = start_assembler(
                [nats_url], sqlite_url, member, tmp_path / f"{member}.log", PARTITIONS
            )
        await wait_for_shares(nc, topology, {"a": (8, 8), "b": (8, 8)}, 40.0)
        await check_status(nats_url, sqlite_url, capsys)
        moves = 0
        pins = await pinned_ids(nc, topology)
        for _ in range(FLAPS):
            procs["b"].send_signal(signal.SIGSTOP)
            await asyncio.sleep(FROZEN_S)  # the injected fault's duration, not a wait
            procs["b"].send_signal(signal.SIGCONT)
            await asyncio.sleep(FROZEN_S)
            now = await pinned_ids(nc, topology)
            moves += sum(1 for p in now if now[p] != pins[p] and now[p] is not None)
            pins = now
        assert moves <= MAX_MOVES, f"{moves} pin moves over {FLAPS} flaps"
        await wait_for_shares(nc, topology, {"a": (8, 8), "b": (8, 8)}, 40.0)
        print(f"{moves} pin moves over {FLAPS} flaps of {FROZEN_S} s")
        stop.set()
        await publishing
        await publisher.flush(15)
        await publisher.close()
        steps = sum(len(v) for v in filler.steps.values())
        await wait_until_settled(nc, topology, store, steps, timeout_s=60)
        await check_store(store, filler)
    finally:
        stop_all(list(procs.values()))
        await store.close()
        await close_client(nc)
        server.stop()
