"""Sessions past the broker's retention, served from the store's chunk log (a real
nats-server, a real SQLite store): a session purged from the stream (by subject, as an
operator would) replays from the store with its original timing, marked as from the store; a
session partly retained reads seamlessly (every chunk once, in order); the events endpoint and
``tokenwire replay`` do the same; ``--verify`` still says ``not-retained``.

Ground truth: the script's literal text (tests/replay/sessions.py) and the envelopes sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from typing import Any

import httpx
import msgspec
import pytest
from starlette.applications import Starlette

from tests.fixtures.broker import close_client
from tests.replay.http import serve
from tests.replay.sessions import (
    EXPECTED_REASONING,
    EXPECTED_TEXT,
    commit_folded,
    envelopes,
    publish,
    seen,
)
from tests.replay.test_cli import PARTITIONS, cli_server, env, jsonl  # noqa: F401 - its fixtures
from tokenwire.broker import Topology, connect
from tokenwire.cli import main
from tokenwire.replay import ReplayEvent, events_router, read_session, verify_report
from tokenwire.store import open_store


def new_session() -> str:
    return f"p-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def store(sqlite_url):
    opened = open_store(sqlite_url)
    try:
        yield opened
    finally:
        await opened.close()


async def _recorded(nc, topology, store, session: str):
    sent = envelopes(session)
    await publish(nc, topology, sent, frame_size=5)
    await commit_folded(store, sent)
    return sent


async def _purge(nc, topology: Topology, session: str, *, keep_from: int | None = None) -> None:
    """What retention (or an operator) does: the session's chunks leave the stream."""
    if keep_from is None:
        await nc.jetstream().purge_stream(topology.stream, subject=topology.session_filter(session))
    else:
        await nc.jetstream().purge_stream(topology.stream, seq=keep_from)


async def _read(nc, topology, session, store, **kwargs) -> list[ReplayEvent]:
    return [e async for e in read_session(nc, topology, session, store=store, **kwargs)]


async def test_a_purged_session_replays_from_the_store_with_its_timing(nc, topology, store):
    session = new_session()
    sent = await _recorded(nc, topology, store, session)
    await _purge(nc, topology, session)
    assert await _read(nc, topology, session, None) == []  # the broker alone: gone

    events = await _read(nc, topology, session, store)

    shown = seen(events)
    assert dict(shown.text) == EXPECTED_TEXT
    assert dict(shown.reasoning) == EXPECTED_REASONING
    assert {e.source for e in events} == {"store"}
    assert [e.envelope.time_ns for e in events] == [e.time_ns for e in sent]  # original timing
    assert [e.event_id for e in events] == [f"0:{k}" for k in range(1, len(sent) + 1)]
    report = await verify_report(nc, topology, store, session)  # verify reads the broker only
    assert {d.kind for d in report.differences} == {"not-retained"}


async def test_a_partly_retained_session_reads_seamlessly(nc, topology, store):
    session = new_session()
    sent = await _recorded(nc, topology, store, session)
    info = await nc.jetstream().stream_info(topology.stream, topology.session_filter(session))
    first, last = info.state.first_seq, info.state.last_seq
    cut = first + (last - first) // 2  # inside some step: its head gone, its tail retained
    await _purge(nc, topology, session, keep_from=cut)

    events = await _read(nc, topology, session, store)

    shown = seen(events)
    assert dict(shown.text) == EXPECTED_TEXT  # each step once, whole
    keys = [(e.envelope.turn, e.envelope.step, e.envelope.ordinal) for e in events]
    assert sorted(keys) == sorted((e.turn, e.step, e.ordinal) for e in sent)  # none twice
    sources = [e.source for e in events]
    assert "store" in sources
    assert "broker" in sources
    assert sources == sorted(sources, key=lambda s: s == "broker")  # the store, then the broker
    assert all(e.seq >= cut for e in events if e.source == "broker")


async def test_the_events_endpoint_serves_and_resumes_the_stores_part(nc, topology, store):
    session = new_session()
    sent = await _recorded(nc, topology, store, session)
    await _purge(nc, topology, session)
    router = events_router(lambda: nc, topology, lambda: store)
    async with serve(Starlette(routes=router.routes)) as base:
        url = f"{base}/v1/sessions/{session}/events?follow=false"
        async with httpx.AsyncClient(timeout=20) as client:
            whole = _chunks((await client.get(url)).text)
            cut = whole[10]["id"]
            rest = _chunks((await client.get(url, headers={"Last-Event-ID": cut})).text)
    assert len(whole) == len(sent)
    assert all(c["data"]["source"] == "store" for c in whole)
    assert [c["id"] for c in rest] == [c["id"] for c in whole[11:]]  # nothing missed, repeated


def _chunks(body: str) -> list[dict[str, Any]]:
    out = []
    for block in body.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if fields.get("event") == "chunk":
            out.append({"id": fields["id"], "data": json.loads(fields["data"])})
    return out


def test_tokenwire_replay_prints_a_purged_session_from_the_store(env, capsys):  # noqa: F811
    session = new_session()
    t = Topology(partitions=PARTITIONS)

    async def record_and_purge() -> None:
        nc = await connect(env["TOKENWIRE_NATS_URL"])
        opened = open_store(env["TOKENWIRE_STORE"])
        try:
            await _recorded(nc, t, opened, session)
            await _purge(nc, t, session)
        finally:
            await opened.close()
            await close_client(nc)

    asyncio.run(record_and_purge())
    assert main(["replay", session, "--max"]) == 0
    out = capsys.readouterr().out
    assert "(from the store: the broker no longer retains these steps)" in out
    for text in EXPECTED_TEXT.values():
        assert text in out
    assert main(["replay", session, "--max", "--json"]) == 0
    lines = jsonl(capsys.readouterr().out)
    assert {line["source"] for line in lines} == {"store"}
    assert main(["replay", session, "--verify"]) == 1  # not-retained, as before
    assert "not-retained" in capsys.readouterr().out


async def test_a_followed_read_serves_the_stores_part_then_follows_the_broker(nc, topology, store):
    """What ``tokenwire tail`` reads: the purged steps from the store, then live chunks."""
    session = new_session()
    sent = await _recorded(nc, topology, store, session)
    await _purge(nc, topology, session)
    later = [
        msgspec.structs.replace(e, turn=e.turn + 10) for e in envelopes(session)[:3]
    ]  # a new step's first chunks, after the purge
    events = read_session(nc, topology, session, follow=True, store=store)
    got: list[ReplayEvent] = []
    async with contextlib.aclosing(events):
        await publish(nc, topology, later)
        async with asyncio.timeout(20):
            async for event in events:
                got.append(event)
                if len(got) == len(sent) + len(later):
                    break
    assert [e.source for e in got] == ["store"] * len(sent) + ["broker"] * len(later)
    assert [e.envelope for e in got[len(sent) :]] == later
