"""Process faults: SIGKILL a gateway mid-stream (its in-flight steps are recorded abandoned
once the broker shows they cannot finish: the assembler's timeout passed and the claim's
silence bound, the gateway's idle bound plus its ack timeout; never as messages), SIGKILL
one of two assemblers (the standby takes over: nothing lost, nothing doubled). Real
processes as their deployed users; the committed accounts file on a real nats-server. (The
telemetry consumer killed between its signal's publish and its ack:
tests/telemetry/test_crash_between_publish_and_ack.py.)"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from pathlib import Path

import msgspec
import pytest
from nats.aio.client import Client

from tests.deploy._nats import close, connect_as
from tests.faults import _services as svc
from tests.faults._load import (
    SCRIPTED,
    SESSIONS,
    Load,
    check,
    expected_message,
    percentiles,
    wait_drained,
)
from tests.faults._report import record
from tests.faults._scan import broker_messages, files, leaks
from tests.faults._single import TOPOLOGY, single_node
from tokenwire.broker import SessionReader, free_port
from tokenwire.schemas import ErrorEvent, MessageEvent, chunk_envelopes
from tokenwire.services.scripted_provider import ScriptedServer
from tokenwire.store import Store, open_store

ABANDON_S = 3.0
GATEWAY_IDLE_S = 2.0
"""The killed gateway's claims say it would have ended a silent step after 2 s (plus its
35 s ack timeout): the assembler records its steps abandoned ~37 s after their last chunk."""
CASE_BOUND_S = 150.0 + 2 * SESSIONS
DRAIN_BOUND_S = 90.0
SLOW = msgspec.structs.replace(SCRIPTED, token_rate=8.0)
"""The same content (seed, length, fragment size) streamed over ~3 s, so a step read halfway
by its caller is still in flight when the gateway is killed, however busy the machine."""


async def _turns_in_broker(operator: Client, session: str) -> set[int]:
    reader = SessionReader(operator, TOPOLOGY, session, idle_timeout_s=10.0)
    return {chunk_envelopes(c.payload)[0].turn async for c in reader.replay()}


@pytest.mark.slow
@pytest.mark.timeout(CASE_BOUND_S + 30)
async def test_sigkill_of_a_gateway_mid_stream_records_abandoned_never_messages(
    tmp_path: Path,
) -> None:
    await asyncio.wait_for(_gateway_case(tmp_path), CASE_BOUND_S)


async def _gateway_case(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    port = free_port()
    with single_node(tmp_path) as node:
        gateway = svc.gateway(
            tmp_path,
            node.url("gateway"),
            store_url,
            f"http://127.0.0.1:{port}",
            tag="g",
            idle_s=GATEWAY_IDLE_S,
        )
        assembler = svc.assembler(
            tmp_path, node.url("assembler"), store_url, tag="g", abandon_s=ABANDON_S
        )
        conn = await connect_as("operator", node.url("operator"))
        store = open_store(store_url)
        load = Load(tag="gw-kill", sessions=SESSIONS)
        try:
            with svc.running(gateway, assembler):
                await gateway.ready()
                await assembler.ready()
                async with ScriptedServer(SLOW, port=port):
                    running = asyncio.create_task(load.run(svc.base_url(gateway)))
                    await load.mid_stream.wait()
                    gateway.kill()  # mid-stream by construction: a second step is streaming
                    await running
                outcome = await _abandoned_not_messages(conn.nc, store, load)
                stored_files = await asyncio.to_thread(lambda: [*tmp_path.glob("store.db*")])
                found = leaks(
                    files([gateway.log, assembler.log, *stored_files])
                    + await broker_messages(conn.nc, TOPOLOGY)
                    + [("http", a) for a in load.answers]
                )
        finally:
            await store.close()
            await close(conn)
    record(
        "SIGKILL the gateway mid-stream",
        "in-flight steps recorded abandoned, never messages",
        sessions=SESSIONS,
        **outcome,
        secrets_found=len(found),
    )
    assert outcome["wrong"] == 0
    assert outcome["lost"] == 0
    assert outcome["abandoned"] >= 1  # the kill really caught steps in flight
    assert found == []


async def _abandoned_not_messages(operator: Client, store: Store, load: Load) -> dict[str, int]:
    """Wait until every step with chunks in the broker has an outcome; then classify them."""
    results = {(r.session, r.turn): r for r in load.results}
    due = {
        (load.session(i), t)
        for i in range(load.sessions)
        for t in await _turns_in_broker(operator, load.session(i))
    }
    deadline = time.monotonic() + DRAIN_BOUND_S
    while True:
        outcomes = {
            (o.session, o.turn): o for s in {k[0] for k in due} for o in await store.messages(s)
        }
        if due <= set(outcomes) or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.25)
    counts: Counter[str] = Counter(lost=0, wrong=0, abandoned=0)
    for key in due:
        outcome, result = outcomes.get(key), results.get(key)
        if outcome is None:
            counts["lost"] += 1
        elif isinstance(outcome, MessageEvent):
            # a message only for a step the provider finished, equal to the truth
            ok = result is not None and outcome.message == expected_message(result)
            counts["messages"] += 1
            counts["wrong"] += not ok
        elif isinstance(outcome, ErrorEvent):
            counts[outcome.error.kind] += 1
            counts["wrong"] += result is not None and result.ok  # completed, yet an error?
    counts["caller_ok"] = sum(r.ok for r in load.results)
    counts["caller_failed"] = sum(not r.ok for r in load.results)
    return dict(counts)


@pytest.mark.slow
async def test_sigkill_of_an_assembler_the_standby_takes_over(tmp_path: Path) -> None:
    await asyncio.wait_for(_assembler_case(tmp_path), CASE_BOUND_S)


async def _assembler_case(tmp_path: Path) -> None:
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    port = free_port()
    with single_node(tmp_path) as node:
        gateway = svc.gateway(
            tmp_path, node.url("gateway"), store_url, f"http://127.0.0.1:{port}", tag="a"
        )
        first = svc.assembler(tmp_path, node.url("assembler"), store_url, tag="a1", abandon_s=60.0)
        standby = svc.assembler(
            tmp_path, node.url("assembler"), store_url, tag="a2", abandon_s=60.0
        )
        conn = await connect_as("operator", node.url("operator"))
        store = open_store(store_url)
        load = Load(tag="asm-kill", sessions=SESSIONS)
        try:
            with svc.running(gateway, first, standby):
                for service in (gateway, first, standby):
                    await service.ready()
                async with ScriptedServer(SCRIPTED, port=port):
                    running = asyncio.create_task(load.run(svc.base_url(gateway)))
                    await load.first_turn_done.wait()
                    first.kill()
                    await running
                await wait_drained(store, load)
                tally = await check(store, load, conn.nc, TOPOLOGY)
                found = leaks(
                    files([gateway.log, first.log, standby.log])
                    + [("http", a) for a in load.answers]
                )
        finally:
            await store.close()
            await close(conn)
    record(
        "SIGKILL one of two assemblers",
        "standby takes over: 0 lost, 0 duplicated",
        sessions=SESSIONS,
        steps_ok=tally.ok,
        steps_failed=tally.failed,
        stored=tally.stored_messages,
        chunks=tally.chunks,
        lost=tally.lost,
        duplicated=tally.duplicated,
        wrong=tally.wrong,
        verified=tally.verified,
        latency_s={k: round(v, 2) for k, v in percentiles(load.latencies()).items()},
        secrets_found=len(found),
    )
    assert tally.differences == []
    assert (tally.lost, tally.duplicated, tally.wrong) == (0, 0, 0)
    assert tally.verified == SESSIONS
    assert tally.failed == 0
    assert found == []
