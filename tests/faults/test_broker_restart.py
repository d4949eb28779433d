"""Whole-broker restarts under load on a single node (issue 48): the store catches up by
itself within :data:`CAUGHT_UP_S` of the traffic's end, ``replay --verify`` finds no
difference, no step the caller got whole is recorded as an error, and the assembler says it
is not ready while it cannot do its job. Real processes as their deployed users, the
committed accounts file, ``TOKENWIRE_PROVISION=0``.

The readiness is sampled every 0.2 s from the fault to the catch-up: it must never answer 200
for long while it says it holds no partition (a standby holding nothing, with nothing
waiting at its last poll, is ready, and is pinned with its partition's next message).

- (a) the nats-server SIGKILLed mid-traffic and started again on the same store after an
  outage longer than the member TTL, the abandonment timeout shortened below the outage plus
  the catch-up (a wrong ``abandoned`` verdict would show), SQLite: the issue's own case.
- (d) the assembler SIGKILLed during the broker's outage, started again by its supervisor
  (as compose's ``restart`` or a Deployment would: until it is ready, bounded).
- (e) the store (a PostgreSQL of the test's own) stopped before the broker is killed and
  started again only after the broker is back.

(b) and (c), a whole three-node cluster restarted at once and node by node, are in
test_broker_faults.py (its cluster serves them).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy._nats import Node, close, connect_as
from tests.faults import _services as svc
from tests.faults._load import SCRIPTED, SESSIONS, Load, caught_up, check, percentiles
from tests.faults._postgres import OwnPostgres, own_postgres
from tests.faults._probe import PERIOD_S, Sample, Sampler, probe_base, sample
from tests.faults._report import record
from tests.faults._single import TOPOLOGY, single_node
from tokenwire.broker import free_port
from tokenwire.services.scripted_provider import ScriptedServer
from tokenwire.store import open_store

OUTAGE_S = 10.0
"""The broker stays down this long (a deliberate hold, the fault's length): longer than the
member TTL (6 s), so every heartbeat of before the outage has expired when it comes back."""
ABANDON_S = 15.0
CAUGHT_UP_S = 60.0
"""Every step the callers got whole is stored within this long of the traffic's end."""
TURNS = 3
CASE_BOUND_S = 120.0 + OUTAGE_S + CAUGHT_UP_S
SUPERVISE_BOUND_S = 60.0


@pytest.mark.slow
@pytest.mark.timeout(CASE_BOUND_S + 60)
async def test_a_single_broker_restart_catches_up_without_wrong_outcomes(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    port = free_port()
    with single_node(tmp_path) as node:
        gateway = svc.gateway(
            tmp_path, node.url("gateway"), store_url, f"http://127.0.0.1:{port}", tag="r"
        )
        assembler = svc.assembler(
            tmp_path, node.url("assembler"), store_url, tag="r", abandon_s=ABANDON_S
        )
        with svc.running(gateway, assembler):
            rig = Rig(tmp_path, node, gateway, assembler, store_url, port)
            await rig.ready()
            await asyncio.wait_for(
                _case(
                    rig,
                    f"broker SIGKILL, {OUTAGE_S:g} s down, restart (single node)",
                    "restart",
                    _restart(node),
                ),
                CASE_BOUND_S,
            )


@dataclass
class Rig:
    workdir: Path
    node: Node
    gateway: svc.Service
    assembler: svc.Service
    store_url: str
    port: int
    pg: OwnPostgres | None = None

    async def ready(self) -> None:
        await self.gateway.ready()
        await self.assembler.ready()


@pytest.fixture(scope="module")
def pg_rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """One node, a PostgreSQL of the test's own, a gateway and an assembler for (d) and (e)."""
    workdir = tmp_path_factory.mktemp("broker-restart")
    port = free_port()
    with own_postgres() as pg, single_node(workdir) as node:
        gateway = svc.gateway(
            workdir,
            node.url("gateway"),
            f"sqlite:///{workdir / 'gw.db'}",
            f"http://127.0.0.1:{port}",
            tag="p",
        )
        assembler = svc.assembler(
            workdir, node.url("assembler"), pg.url, tag="p", abandon_s=ABANDON_S
        )
        with svc.running(gateway, assembler):
            rig = Rig(workdir, node, gateway, assembler, pg.url, port, pg)
            asyncio.run(rig.ready())
            yield rig


@pytest.mark.slow
@pytest.mark.timeout(CASE_BOUND_S + 60)
async def test_an_assembler_killed_during_a_broker_outage_is_replaced_and_catches_up(
    pg_rig: Rig,
) -> None:
    async def fault() -> None:
        pg_rig.node.kill()
        pg_rig.assembler.kill()  # during the outage: whatever it held is unacknowledged
        await asyncio.sleep(OUTAGE_S)  # the outage itself, not a wait for a condition
        pg_rig.node.start()
        pg_rig.node.wait_accepting()
        await _supervise(pg_rig.assembler)

    await asyncio.wait_for(
        _case(
            pg_rig,
            f"assembler SIGKILL during a {OUTAGE_S:g} s broker outage, both restarted",
            "asm-outage",
            fault,
            replaced=True,
        ),
        CASE_BOUND_S,
    )


@pytest.mark.slow
@pytest.mark.timeout(CASE_BOUND_S + 60)
async def test_the_store_down_during_a_broker_restart_loses_nothing(pg_rig: Rig) -> None:
    pg = pg_rig.pg
    assert pg is not None

    async def fault() -> None:
        await asyncio.to_thread(pg.stop)  # immediate shutdown, before the broker dies
        await _until_not_ready(pg_rig.assembler, "store")  # a commit met the outage
        await _restart(pg_rig.node)()
        await asyncio.to_thread(pg.start)  # the store comes back after the broker

    await asyncio.wait_for(
        _case(
            pg_rig,
            f"store down during a broker restart ({OUTAGE_S:g} s, single node)",
            "pg-restart",
            fault,
        ),
        CASE_BOUND_S,
    )


def _restart(node: Node) -> Callable[[], Awaitable[None]]:
    async def fault() -> None:
        node.kill()
        await asyncio.sleep(OUTAGE_S)  # the outage itself, not a wait for a condition
        node.start()
        node.wait_accepting()

    return fault


async def _until_not_ready(service: svc.Service, reason: str) -> None:
    """Until the service's /readyz names ``reason`` (bounded)."""
    assert service.probe is not None
    deadline = time.monotonic() + SUPERVISE_BOUND_S
    while reason not in (await asyncio.to_thread(sample, probe_base(service.probe))).reasons:
        assert time.monotonic() < deadline, f"{service.name} never said {reason}"
        await asyncio.sleep(0.2)


async def _supervise(service: svc.Service) -> None:
    """Start ``service`` again until it is ready, as a supervisor would (bounded): a start
    while JetStream still loads its streams exits at its layout check."""
    deadline = time.monotonic() + SUPERVISE_BOUND_S
    service.start()
    while not service.answers():
        assert service.proc is not None
        if service.proc.poll() is not None:
            assert time.monotonic() < deadline, f"{service.name}:\n{service.text()[-3000:]}"
            service.start()
        assert time.monotonic() < deadline, f"{service.name} not ready:\n{service.text()[-3000:]}"
        await asyncio.sleep(0.2)


def _latency(load: Load) -> dict[str, float]:
    return {k: round(v, 2) for k, v in percentiles(load.latencies()).items()}


async def _case(
    rig: Rig, case: str, tag: str, fault: Callable[[], Awaitable[None]], *, replaced: bool = False
) -> None:
    """Load, ``fault``, then the checks; ``replaced``: the fault replaces the assembler's
    process (its readiness then starts from a fresh standby's)."""
    store = open_store(rig.store_url)
    load = Load(tag=tag, sessions=SESSIONS, turns=TURNS)
    assert rig.assembler.probe is not None
    sampler = Sampler(probe_base(rig.assembler.probe)).start()
    try:
        async with ScriptedServer(SCRIPTED, port=rig.port):
            running = asyncio.create_task(load.run(svc.base_url(rig.gateway)))
            await load.mid_stream.wait()  # steps in flight, chunks already published
            faulted_at = time.monotonic()
            await fault()
            back_at = time.monotonic()
            await running
        ended_at = time.monotonic()
        after_s, missing = await caught_up(store, load, CAUGHT_UP_S)
        done_at = time.monotonic()
        conn = await connect_as("operator", rig.node.url("operator"))
        try:
            tally = await check(store, load, conn.nc, TOPOLOGY)
        finally:
            await close(conn)
    finally:
        samples = await sampler.stop()
        await store.close()
    during = [s for s in samples if faulted_at <= s.at <= done_at]
    owning_none = _ready_owning_none(during)
    held = "ready holding nothing <= 1.5 s at a time" if replaced else "not ready holding nothing"
    record(
        case,
        f"stored within {CAUGHT_UP_S:g} s of the traffic's end, verify ok, {held}",
        sessions=SESSIONS,
        steps_ok=tally.ok,
        steps_failed=tally.failed,
        stored=tally.stored_messages,
        errors_stored=tally.stored_errors,
        lost=tally.lost,
        wrong=tally.wrong,
        verified=tally.verified,
        verify_differences=sum(": verify: " in d for d in tally.differences),
        outage_s=round(back_at - faulted_at, 1),
        caught_up_s=None if after_s is None else round(after_s, 1),
        missing_at_bound=missing,
        traffic_after_restart_s=round(ended_at - back_at, 1),
        samples=len(during),
        not_ready_samples=sum(s.status != 200 for s in during),
        owning_none_samples=sum(s.owned == 0 for s in during),
        ready_while_owning_none=len(owning_none),
        not_ready_reasons=_reasons(during),
        longest_ready_owning_none_s=round(_longest(during), 1),
        latency_s=_latency(load),
    )
    assert after_s is not None, f"{missing} completed steps not stored {CAUGHT_UP_S:g} s after"
    assert tally.differences == []
    assert (tally.lost, tally.wrong, tally.stored_errors, tally.failed) == (0, 0, 0, 0)
    assert tally.verified == SESSIONS
    if replaced:  # a fresh standby with nothing waiting at its last poll is ready, and is
        # pinned with its partition's next message: a readiness period (1 s) and a sample apart
        assert _longest(during) <= READY_OWNING_NONE_S, owning_none[:3]
    else:  # an instance that held partitions is not ready once it holds none (until a poll)
        assert owning_none == [], owning_none[:3]


READY_OWNING_NONE_S = 1.5


def _ready_owning_none(samples: list[Sample]) -> list[Sample]:
    """Answers of 200 from an assembler that said it held no partition."""
    return [s for s in samples if s.status == 200 and s.owned == 0]


def _longest(samples: list[Sample]) -> float:
    """The longest stretch of consecutive samples answering 200 while holding nothing (a
    single such sample counts as one sampling period)."""
    longest, start = 0.0, None
    for s in samples:
        if s.status == 200 and s.owned == 0:
            start = s.at if start is None else start
            longest = max(longest, s.at - start + PERIOD_S)
        else:
            start = None
    return longest


def _reasons(samples: list[Sample]) -> dict[str, int]:
    """How many not-ready answers named each reason."""
    counts: dict[str, int] = {}
    for s in samples:
        if s.status != 200:
            for reason in s.reasons:
                counts[reason] = counts.get(reason, 0) + 1
    return counts
