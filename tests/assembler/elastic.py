"""Helpers for the elastic-share tests: assembler processes, and who owns what per the server.

Ownership is read from the server (each partition consumer's ``pinned_client_id``) and named
through the members' heartbeats (each member reports the pin ids it holds), so a test checks
the broker's view, not only what the instances believe.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

from nats.aio.client import Client

from tokenwire.broker import Topology
from tokenwire.services.assembler._members import MemberBoard

REPO = Path(__file__).resolve().parents[2]

TIMINGS = {
    "TOKENWIRE_ASSEMBLER_PRIORITY_TIMEOUT_S": "2",
    "TOKENWIRE_ASSEMBLER_HEARTBEAT_S": "0.5",
    "TOKENWIRE_ASSEMBLER_MEMBER_TTL_S": "3",
}
"""The tests' membership timings (the topology is provisioned with the same ones)."""
PRIORITY_TIMEOUT_S, MEMBER_TTL_S = 2.0, 3.0


def start_assembler(
    urls: list[str], store_url: str, member: str, log: Path, partitions: int, **env: str
) -> subprocess.Popen[bytes]:
    """``python -m tokenwire.services.assembler`` as member ``member`` (no provisioning)."""
    full = {
        **os.environ,
        "TOKENWIRE_NATS_URL": ",".join(urls),
        "TOKENWIRE_STORE": store_url,
        "TOKENWIRE_PARTITIONS": str(partitions),
        "TOKENWIRE_ASSEMBLER_PROVISION": "0",
        "TOKENWIRE_ASSEMBLER_METRICS_ADDR": "off",
        "TOKENWIRE_ASSEMBLER_MEMBER": member,
        **TIMINGS,
        **env,
    }
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "tokenwire.services.assembler"],
            env=full,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


async def pinned_ids(nc: Client, topology: Topology) -> dict[int, str | None]:
    """Per partition, the pin id the server holds for the assembler group (None: unpinned)."""
    out: dict[int, str | None] = {}
    for p in range(topology.partitions):
        subject = f"$JS.API.CONSUMER.INFO.{topology.stream}.{topology.assembler_consumer(p)}"
        info = json.loads((await nc.request(subject, b"", timeout=5.0)).data)
        groups = info.get("priority_groups") or []
        out[p] = next(
            (g.get("pinned_client_id") for g in groups if g.get("pinned_client_id")), None
        )
    return out


async def ownership(nc: Client, topology: Topology) -> dict[int, str | None]:
    """Per partition, the member the server has it pinned to (None: unpinned or unnamed)."""
    records = await MemberBoard(nc, topology).read() or {}
    by_pin = {pin: name for name, r in records.items() for pin in r.pins.values()}
    return {
        p: by_pin.get(pin) if pin else None for p, pin in (await pinned_ids(nc, topology)).items()
    }


def counts(owners: dict[int, str | None]) -> dict[str | None, int]:
    return dict(Counter(owners.values()))


async def wait_for(
    check: Callable[[], Awaitable[bool]], timeout_s: float, what: Callable[[], Awaitable[str]]
) -> float:
    """Poll ``check`` until true; returns the seconds it took; AssertionError after the bound."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not await check():
        if loop.time() - started > timeout_s:
            raise AssertionError(f"not reached within {timeout_s} s: {await what()}")
        await asyncio.sleep(0.1)
    return loop.time() - started


async def wait_for_shares(
    nc: Client, topology: Topology, want: dict[str, tuple[int, int]], timeout_s: float
) -> float:
    """Until the server's pins give every member in ``want`` a count within its (lo, hi) and
    no partition is unowned or owned by anyone else; returns the seconds it took."""
    last: dict[str | None, int] = {}

    async def check() -> bool:
        nonlocal last
        try:
            last = counts(await ownership(nc, topology))
        except TimeoutError:  # a consumer-info query unanswered on a loaded machine: ask again
            return False
        inside = all(lo <= last.get(m, 0) <= hi for m, (lo, hi) in want.items())
        return inside and set(last) <= set(want)

    async def what() -> str:
        return f"ownership {last}, wanted {want}"

    return await wait_for(check, timeout_s, what)
