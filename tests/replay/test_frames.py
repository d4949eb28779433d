"""The readers of the retained stream on frames (schema version 2, ADR 0024): replay shows
one event per chunk with its own time, verify and rebuild fold them, the events endpoint
resumes exactly inside a frame (``Last-Event-ID: N:I``, ``?from_seq=N:I``), and a stream
holding both versions reads as one. The truth is the literal script (tests/replay/sessions.py).
"""

from __future__ import annotations

import itertools
import uuid

import httpx
import pytest
from starlette.applications import Starlette

from tests.replay.http import serve
from tests.replay.sessions import (
    EXPECTED_REASONING,
    EXPECTED_TEXT,
    commit_folded,
    envelopes,
    publish,
    seen,
)
from tests.replay.test_sse import sse_events, text_by_step
from tokenwire.cli._rebuild import rebuild_session
from tokenwire.replay import SseStats, events_router, paced, read_session, verify
from tokenwire.services.assembler import AssemblyConfig
from tokenwire.store import open_store


def new_session() -> str:
    return f"f-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def store(sqlite_url):
    opened = open_store(sqlite_url)
    try:
        yield opened
    finally:
        await opened.close()


async def test_replay_of_frames_shows_every_chunk_with_its_own_time(nc, topology):
    session = new_session()
    sent = envelopes(session)
    messages = await publish(nc, topology, sent, frame_size=6)
    events = [e async for e in read_session(nc, topology, session)]
    assert len(events) == len(sent) > messages
    assert [(e.envelope.turn, e.envelope.step, e.envelope.ordinal) for e in events] == [
        (e.turn, e.step, e.ordinal) for e in sent
    ]
    assert [e.envelope.time_ns for e in events] == [e.time_ns for e in sent]
    assert [e.envelope.chunk for e in events] == [e.chunk for e in sent]
    shown = seen(events)
    assert shown.text == EXPECTED_TEXT
    assert shown.reasoning == EXPECTED_REASONING
    # positions: a message's chunks share its seq, indexed from 0, the last one marked
    by_seq: dict[int, list[int]] = {}
    for e in events:
        by_seq.setdefault(e.seq, []).append(e.index)
    assert len(by_seq) == messages
    assert all(indexes == list(range(len(indexes))) for indexes in by_seq.values())
    assert [e.last for e in events] == [e.index == len(by_seq[e.seq]) - 1 for e in events]
    assert {e.event_id for e in events if e.last} == {str(s) for s in by_seq}


async def test_paced_replay_keeps_each_chunks_time(nc, topology):
    """20 ms between chunks in the script: the schedule follows every chunk, not frames."""
    session = new_session()
    sent = envelopes(session)[:12]
    await publish(nc, topology, sent, frame_size=5)
    slept: list[float] = []
    now = [0.0]

    async def sleep(s: float) -> None:
        slept.append(round(s, 6))
        now[0] += s

    events = paced(read_session(nc, topology, session), 1.0, clock=lambda: now[0], sleep=sleep)
    got = [e async for e in events]
    assert len(got) == 12
    gaps = [round((b.time_ns - a.time_ns) / 1e9, 6) for a, b in itertools.pairwise(sent)]
    assert slept == gaps


async def test_verify_and_rebuild_on_a_stream_of_both_versions(nc, topology, tmp_path):
    session = new_session()
    sent = envelopes(session)
    half = len(sent) // 2
    await publish(nc, topology, sent[:half])  # version 1, one chunk a message
    await publish(nc, topology, sent[half:], frame_size=4)  # then frames
    assembled = open_store(f"sqlite:///{tmp_path}/assembled.db")
    rebuilt = open_store(f"sqlite:///{tmp_path}/rebuilt.db")
    try:
        await commit_folded(assembled, sent)
        assert await verify(nc, topology, assembled, session) == []
        # an empty store rebuilt from the stream holds the same outcomes
        result = await rebuild_session(nc, topology, rebuilt, session, AssemblyConfig())
        assert result.chunks == len(sent)
        assert result.inserted == len({(e.turn, e.step) for e in sent})
        assert await rebuilt.messages(session) == await assembled.messages(session)
        assert await verify(nc, topology, rebuilt, session) == []
    finally:
        await assembled.close()
        await rebuilt.close()


@pytest.fixture
async def base_url(nc, topology, store):
    router = events_router(lambda: nc, topology, lambda: store, stats=SseStats())
    async with serve(Starlette(routes=router.routes)) as url:
        yield url


async def test_sse_ids_inside_frames_resume_exactly(nc, topology, base_url):
    session = new_session()
    sent = envelopes(session)
    await publish(nc, topology, sent, frame_size=5)
    url = f"{base_url}/v1/sessions/{session}/events?follow=false"
    async with httpx.AsyncClient(timeout=20) as client:
        whole = [(i, d) for kind, i, d in await sse_events(client, url) if kind == "chunk"]
        ids = [i for i, _ in whole]
        assert len(ids) == len(sent) == len(set(ids))
        assert any(":" in i for i in ids)
        assert any(":" not in i for i in ids)
        assert text_by_step(d for _, d in whole) == EXPECTED_TEXT
        for cut in (0, 1, 2, 3, 7, len(ids) // 2, len(ids) - 2):
            rest = await sse_events(client, url, headers={"Last-Event-ID": ids[cut]})
            assert [i for kind, i, _ in rest if kind == "chunk"] == ids[cut + 1 :], ids[cut]
        inside = next(k for k, i in enumerate(ids) if ":" in i)
        seq, index = ids[inside].split(":")
        started = await sse_events(client, f"{url}&from_seq={seq}:{index}")
        assert [i for kind, i, _ in started if kind == "chunk"] == ids[inside:]


@pytest.mark.parametrize(
    "header",
    ["5:", "5:-1", "5:x", f"5:{2**32}", ":3", "5:1:2"],  # "0:K" names the store's chunk K
)
async def test_a_bad_position_inside_a_frame_is_a_400(nc, topology, base_url, header):
    url = f"{base_url}/v1/sessions/{new_session()}/events?follow=false"
    async with httpx.AsyncClient(timeout=20) as client:
        by_header = await client.get(url, headers={"Last-Event-ID": header})
        by_query = await client.get(f"{url}&from_seq={header}")
    assert by_header.status_code == 400, header
    assert by_query.status_code == 400, header
    assert by_header.json()["error"]["type"] == "invalid_request_error"
