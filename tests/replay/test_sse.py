"""The session events endpoint over a real socket: ids, exact resume, follow, slow readers."""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse
from starlette.applications import Starlette

from tests.replay.http import serve
from tests.replay.sessions import EXPECTED_TEXT, commit_folded, envelopes, publish, split
from tokenwire.replay import SlowReaderPolicy, SseStats, events_router, read_session
from tokenwire.schemas import ChunkEnvelope, Finish, StreamChunk, TextDelta
from tokenwire.store import open_store


def new_session() -> str:
    return f"e-{uuid.uuid4().hex[:12]}"


@pytest.fixture
async def store(sqlite_url):
    opened = open_store(sqlite_url)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
def stats() -> SseStats:
    return SseStats()


@pytest.fixture
def policy() -> SlowReaderPolicy:
    return SlowReaderPolicy(keepalive_s=0.5)


@pytest.fixture
def send_buffer() -> int | None:
    return None


@pytest.fixture
async def base_url(nc, topology, store, stats, policy, send_buffer):
    router = events_router(lambda: nc, topology, lambda: store, policy=policy, stats=stats)
    async with serve(Starlette(routes=router.routes), send_buffer=send_buffer) as url:
        yield url


async def sse_events(client, url, *, count=None, headers=None):
    """(event type, id, data) of each SSE event, until ``count`` chunk events or the end."""
    out = []
    async with aconnect_sse(client, "GET", url, headers=headers or {}) as source:
        assert source.response.status_code == 200
        async for sse in source.aiter_sse():
            out.append((sse.event, sse.id, json.loads(sse.data) if sse.data else None))
            if count is not None and sum(e[0] == "chunk" for e in out) == count:
                break
    return out


def text_by_step(datas) -> dict[tuple[int, int], str]:
    text: dict[tuple[int, int], str] = {}
    for data in datas:
        key = (data["envelope"]["turn"], data["envelope"]["step"])
        for shown in data["shown"]:
            if shown["type"] == "text":
                text[key] = text.get(key, "") + shown["text"]
    return text


async def test_events_carry_the_stream_seq_as_id_and_end_when_caught_up(nc, topology, base_url):
    session = new_session()
    sent = envelopes(session)
    await publish(nc, topology, sent)
    expected_seqs = [e.seq async for e in read_session(nc, topology, session)]

    async with httpx.AsyncClient(timeout=20) as client:
        got = await sse_events(client, f"{base_url}/v1/sessions/{session}/events?follow=false")

    chunks = [(i, d) for kind, i, d in got if kind == "chunk"]
    assert [int(i) for i, _ in chunks] == expected_seqs
    assert [d["seq"] for _, d in chunks] == expected_seqs
    assert text_by_step(d for _, d in chunks) == EXPECTED_TEXT


async def test_last_event_id_resumes_exactly_while_following_live(nc, topology, base_url):
    session = new_session()
    sent = envelopes(session)
    await publish(nc, topology, sent[:50])
    url = f"{base_url}/v1/sessions/{session}/events"
    async with httpx.AsyncClient(timeout=20) as client:
        first = await sse_events(client, url, count=20)  # then the client goes away
        last_id = [i for kind, i, _ in first if kind == "chunk"][-1]

        async def rest():
            return await sse_events(
                client, url, count=len(sent) - 20, headers={"Last-Event-ID": last_id}
            )

        task = asyncio.create_task(rest())
        await asyncio.sleep(0.2)
        await publish(nc, topology, sent[50:])  # live chunks reach the resumed stream
        second = await asyncio.wait_for(task, 20)

    datas = [d for kind, _, d in first + second if kind == "chunk"]
    assert [d["envelope"]["ordinal"] for d in datas] == [e.ordinal for e in sent]
    seqs = [d["seq"] for d in datas]
    assert seqs == sorted(set(seqs))
    assert text_by_step(datas) == EXPECTED_TEXT


async def test_from_seq_starts_at_that_seq(nc, topology, base_url):
    session = new_session()
    await publish(nc, topology, envelopes(session))
    seqs = [e.seq async for e in read_session(nc, topology, session)]
    url = f"{base_url}/v1/sessions/{session}/events?follow=false&from_seq={seqs[10]}"
    async with httpx.AsyncClient(timeout=20) as client:
        got = await sse_events(client, url)
    assert [int(i) for kind, i, _ in got if kind == "chunk"] == seqs[10:]


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/v1/sessions/bad%20id/events", {}),
        ("/v1/sessions/ok/events?from_seq=zero", {}),
        ("/v1/sessions/ok/events?from_seq=0", {}),
        ("/v1/sessions/ok/events?follow=maybe", {}),
        ("/v1/sessions/ok/events", {"Last-Event-ID": "x"}),
        ("/v1/sessions/" + "a" * 129 + "/messages", {}),
        ("/v1/sessions?limit=0", {}),
    ],
)
async def test_bad_requests_get_a_400_json_error(base_url, path, headers):
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(base_url + path, headers=headers)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_sessions_and_messages_come_from_the_store(nc, topology, store, base_url):
    session = new_session()
    sent = envelopes(session)
    await commit_folded(store, sent)
    async with httpx.AsyncClient(timeout=10) as client:
        listed = (await client.get(f"{base_url}/v1/sessions")).json()
        messages = (await client.get(f"{base_url}/v1/sessions/{session}/messages")).json()
        missing = await client.get(f"{base_url}/v1/sessions/nobody/messages")
    assert [s["session"] for s in listed["sessions"]] == [session]
    assert listed["sessions"][0]["chunks"] == len(sent)
    assert [(m["type"], m["turn"], m["step"]) for m in messages["messages"]] == [
        ("message", 0, 0),
        ("message", 1, 0),
        ("message", 1, 1),
        ("error", 2, 0),
    ]
    assert missing.status_code == 404


def many_steps(session: str, steps: int) -> tuple[list[ChunkEnvelope], dict[tuple[int, int], str]]:
    """``steps`` short steps (text + finish), so a full queue cannot merge a step's start."""
    script: dict[tuple[int, int], list[StreamChunk]] = {}
    expected: dict[tuple[int, int], str] = {}
    for i in range(steps):
        text = f"Step {i} streams a few words of text. "
        script[0, i] = [*(TextDelta(0, t) for t in split(text, 5)), Finish("stop")]
        expected[0, i] = text
    return envelopes(session, script), expected


def dechunk(body: bytes) -> bytes:
    out, rest = b"", body
    while rest:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        out, rest = out + rest[:size], rest[size + 2 :]
    return out


def parse_sse(text: str) -> list[tuple[str, str | None, dict[str, Any] | None]]:
    events = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            if line and not line.startswith(":"):
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
        if "data" in fields:
            events.append(
                (fields.get("event", "message"), fields.get("id"), json.loads(fields["data"]))
            )
    return events


async def ephemeral_consumers(nc, topology) -> list[str]:
    reply = await nc.request(f"$JS.API.CONSUMER.NAMES.{topology.stream}", b"{}", timeout=5)
    names = json.loads(reply.data)["consumers"] or []
    return [n for n in names if not n.startswith(("assembler-", topology.telemetry_consumer))]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("policy", "send_buffer"),
    [(SlowReaderPolicy(queue_bound=16, max_pause_s=0.5, keepalive_s=0.5), 4096)],
)
async def test_a_reader_that_does_not_read_is_told_it_lagged_and_never_blocks_the_broker(
    nc, topology, store, base_url, stats
):
    session = new_session()
    sent, expected = many_steps(session, 400)
    host, port = base_url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a tiny window, never read
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (host, int(port)))
    request = (
        f"GET /v1/sessions/{session}/events HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    await loop.sock_sendall(sock, request.encode())
    try:
        await publish(nc, topology, sent)  # the pipeline side completes regardless
        for _ in range(200):  # bounded wait for the server to give up on the client
            if stats.lagged:
                break
            await asyncio.sleep(0.05)
        assert stats.lagged == 1, "the stalled client was never marked lagged"
        assert stats.coalesced > 0
        assert stats.pauses > 0
        # The client has still read nothing, yet its broker read is over and its ephemeral
        # consumer is gone: nothing on the broker waits for it.
        assert await ephemeral_consumers(nc, topology) == []
        others = [e async for e in read_session(nc, topology, session)]
        assert len(others) == len(sent)

        received = b""
        while chunk := await asyncio.wait_for(loop.sock_recv(sock, 65536), 20):
            received += chunk
    finally:
        sock.close()

    head, _, body = received.partition(b"\r\n\r\n")
    assert b" 200 " in head.split(b"\r\n")[0]
    events = parse_sse(dechunk(body).decode())
    kinds = [kind for kind, _, _ in events]
    assert kinds[-1] == "lagged"
    assert kinds.count("lagged") == 1
    chunk_ids = [int(i) for kind, i, _ in events if kind == "chunk"]  # type: ignore[arg-type]  # chunk events have ids
    lagged = events[-1][2]
    assert lagged is not None
    assert lagged["last_id"] == chunk_ids[-1]
    assert lagged["from_seq"] == chunk_ids[-1] + 1

    # Reconnect as EventSource does (Last-Event-ID = the last id got), here to another
    # gateway instance with the default bound, as after a load balancer's switch.
    router = events_router(lambda: nc, topology, lambda: store)
    async with (
        serve(Starlette(routes=router.routes)) as other,
        httpx.AsyncClient(timeout=20) as client,
    ):
        url = f"{other}/v1/sessions/{session}/events?follow=false"
        rest = await sse_events(client, url, headers={"Last-Event-ID": str(lagged["last_id"])})
    assert "lagged" not in [kind for kind, _, _ in rest]

    datas = [d for kind, _, d in events if kind == "chunk"] + [
        d for kind, _, d in rest if kind == "chunk"
    ]
    seqs = [d["seq"] for d in datas]
    assert seqs == sorted(set(seqs))  # nothing repeated
    assert seqs[-1] == others[-1].seq
    assert text_by_step(datas) == expected  # nothing missed (coalesced text included)
    finishes = sum(s["type"] == "finish" for d in datas for s in d["shown"])
    assert finishes == len(expected)


async def test_past_the_reader_cap_the_events_endpoint_answers_503_with_retry_after(
    nc, topology, store, stats
):
    """Two readers at most: a third gets 503 in the endpoint's JSON dialect with
    ``retry-after``; once one of the two ended, a new reader is served again."""
    router = events_router(lambda: nc, topology, lambda: store, stats=stats, max_readers=2)
    session = new_session()
    await publish(nc, topology, envelopes(session)[:10])
    async with serve(Starlette(routes=router.routes)) as url, httpx.AsyncClient(timeout=20) as c:
        events = f"{url}/v1/sessions/{session}/events"  # following: each stays open
        async with c.stream("GET", events) as first, c.stream("GET", events) as second:
            assert (first.status_code, second.status_code) == (200, 200)
            refused = await c.get(events)
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["type"] == "overloaded"
            assert "at most 2" in refused.json()["error"]["message"]
            assert (stats.clients, stats.refused) == (2, 1)
        for _ in range(200):  # both responses closed: their slots are free (bounded wait)
            if stats.clients == 0:
                break
            await asyncio.sleep(0.05)
        again = await c.get(f"{events}?follow=false")
        assert again.status_code == 200
        assert again.text.count("event: chunk") == 10
    assert (stats.clients, stats.refused) == (0, 1)


def test_a_reader_cap_below_one_is_refused(nc, topology, store) -> None:
    with pytest.raises(ValueError, match="max_readers"):
        events_router(lambda: nc, topology, lambda: store, max_readers=0)
