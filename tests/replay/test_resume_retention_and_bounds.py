"""Resume ids, retention and bounds of the read side, against a real nats-server and store.

- ``verify`` on a step whose first chunks retention removed, and on retained chunks the
  assembler rejects (the store filled by the assembler's own core, the oracle);
- the events endpoint's resume parameters: both checked, and bounded by JetStream's range;
- resuming exactly after the stream's head was purged, with sessions on other partitions
  interleaved on the stream;
- the slow-reader pause (no consumer left on the broker while paused) and client disconnects
  (the server's consumer count goes back to what it was).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable, Sequence

import httpx
import pytest
from httpx_sse import aconnect_sse
from starlette.applications import Starlette

from tests.replay.http import serve
from tests.replay.sessions import by_step, envelopes, publish, queued_event, split
from tokenwire.broker import Topology, partition_of
from tokenwire.broker._ordered import READER_NAME_PREFIX
from tokenwire.replay import (
    ClientQueue,
    ReplayEvent,
    SlowReaderPolicy,
    SseStats,
    events_router,
    read_session,
    verify_report,
)
from tokenwire.replay._sse import produce
from tokenwire.schemas import (
    ChunkEnvelope,
    ErrorEvent,
    Finish,
    MessageEvent,
    StreamChunk,
    TextDelta,
    TokenUsage,
    Usage,
)
from tokenwire.services.assembler import Assembly, ClosedStep
from tokenwire.store import Store, open_store

MAX_SEQ = 2**64 - 1


def new_session() -> str:
    return f"r-{uuid.uuid4().hex[:12]}"


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
async def base_url(nc, topology, store, stats):
    policy = SlowReaderPolicy(keepalive_s=0.5)
    router = events_router(lambda: nc, topology, lambda: store, policy=policy, stats=stats)
    async with serve(Starlette(routes=router.routes)) as url:
        yield url


async def until(check: Callable[[], Awaitable[bool]], what: str, bound_s: float = 15.0) -> None:
    """Wait (bounded) until ``check()`` holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound_s
    while not await check():
        assert loop.time() < deadline, f"not within {bound_s} s: {what}"
        await asyncio.sleep(0.05)


async def readers(nc, topology: Topology) -> list[str]:
    """The ephemeral read consumers on the chunk stream, as the server lists them."""
    reply = await nc.request(f"$JS.API.CONSUMER.NAMES.{topology.stream}", b"{}", timeout=5)
    names = json.loads(reply.data)["consumers"] or []
    return [n for n in names if n.startswith(READER_NAME_PREFIX)]


async def commit_as_the_assembler(store: Store, sent: Sequence[ChunkEnvelope]) -> None:
    """Fill the store with what the assembler's own core makes of ``sent`` (in that order):
    rejected chunks are dead-lettered there, unfinished steps closed as gap or abandoned."""
    assembly: Assembly[int] = Assembly(clock=lambda: 0)
    records = []
    for token, envelope in enumerate(sent):
        outcome = assembly.feed(envelope, token)
        if isinstance(outcome, ClosedStep):
            records.append(outcome.record)
    records += [closed.record for closed in assembly.close_all(0)]
    await store.commit(records)


async def seqs_of(nc, topology: Topology, session: str) -> list[int]:
    return [e.seq async for e in read_session(nc, topology, session)]


# -- verify and retention ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "removed"),
    [(40, 3), (5000, 3), (5000, 4500)],
    ids=["short-step", "step-past-the-reorder-window", "most-of-a-long-step"],
)
async def test_a_step_whose_first_chunks_retention_removed_is_not_retained_not_a_wrong_outcome(
    nc, topology, store, length, removed
):
    """The stream's limits removed its oldest messages, cutting into a step: the store is
    still right, the step cannot be checked. Before, verify reported the stored message as an
    ``outcome`` difference (against a "gap") plus a ``chunks`` one; and for a step longer
    than the fold's reorder window (4096 chunks) it raised ReorderWindowError instead of
    reporting anything."""
    session = new_session()
    script: dict[tuple[int, int], list[StreamChunk]] = {
        (0, 0): [
            *(TextDelta(0, f"w{i} ") for i in range(length)),
            Usage(TokenUsage(input_tokens=9, output_tokens=length)),
            Finish("stop"),
        ],
        (0, 1): [
            *(TextDelta(0, t) for t in split("All of this step is retained.")),
            Finish("stop"),
        ],
    }
    sent = envelopes(session, script)
    await publish(nc, topology, sent)
    await commit_as_the_assembler(store, sent)
    seqs = await seqs_of(nc, topology, session)
    await nc.jetstream().purge_stream(topology.stream, seq=seqs[removed])  # keeps >= that seq

    report = await verify_report(nc, topology, store, session)

    kept, stored = len(script[0, 0]) - removed, len(script[0, 0])
    assert [(d.turn, d.step, d.kind) for d in report.differences] == [(0, 0, "not-retained")]
    assert f"retains {kept} of its {stored} stored chunks" in report.differences[0].detail
    assert report.chunks == len(sent) - removed


async def test_a_chunk_missing_from_the_middle_of_a_step_is_not_called_retention(
    nc, topology, store
):
    """Retention removes a step's first chunks, never one in its middle: a retained step with
    a hole after its start is a real difference (its fold is a gap), not ``not-retained``."""
    session = new_session()
    script: dict[tuple[int, int], list[StreamChunk]] = {
        (0, 0): [*(TextDelta(0, f"w{i} ") for i in range(40)), Finish("stop")],
    }
    sent = envelopes(session, script)
    await publish(nc, topology, sent)
    await commit_as_the_assembler(store, sent)
    seqs = await seqs_of(nc, topology, session)
    await nc.jetstream().delete_msg(topology.stream, seqs[20])

    report = await verify_report(nc, topology, store, session)

    kinds = [(d.turn, d.step, d.kind) for d in report.differences]
    assert (0, 0, "not-retained") not in kinds
    assert (0, 0, "outcome") in kinds  # a stored message against a retained gap
    assert report.chunks == len(sent) - 1


@pytest.mark.parametrize("rejected", ["negative-ordinal", "past-the-reorder-window"])
async def test_a_retained_chunk_the_assembler_rejects_is_a_chunks_difference_not_a_crash(
    nc, topology, store, rejected
):
    """A publisher other than the gateway put a chunk on the session's subject that the
    assembler dead-letters (ordinal -1; ordinal 6000 while ordinal 6 never came). verify
    raised InvalidOrdinal / ReorderWindowError; it now folds the step as the assembler did
    and names the extra chunk."""
    session = new_session()
    text: list[StreamChunk] = [TextDelta(0, t) for t in split("Six fragments of text go here.", 5)]
    complete = rejected == "negative-ordinal"
    script: dict[tuple[int, int], list[StreamChunk]] = {
        (0, 0): [*text, Finish("stop")] if complete else text
    }
    sent = envelopes(session, script)
    bad = ChunkEnvelope(
        session,
        0,
        0,
        -1 if complete else 6000,
        sent[-1].time_ns + 1,
        "scripted",
        "tools",
        TextDelta(0, "injected"),
    )
    on_stream = [*sent[:3], bad, *sent[3:]]
    await publish(nc, topology, on_stream)
    await commit_as_the_assembler(store, on_stream)

    report = await verify_report(nc, topology, store, session)

    assert [(d.turn, d.step, d.kind) for d in report.differences] == [(0, 0, "chunks")]
    assert f"retained {len(sent) + 1}" in report.differences[0].detail
    assert report.chunks == len(on_stream)


async def test_interleaved_steps_an_error_and_a_max_tokens_cut_verify_clean_as_assembled(
    nc, topology, store
):
    """The scripted session's four steps (parallel tool calls, a max-tokens cut that drops a
    call, a provider error) streamed at once, interleaved on the stream, one chunk stored
    late (a retried publish): the store the assembler's core makes of it verifies clean."""
    session = new_session()
    steps = list(by_step(envelopes(session)).values())
    interleaved = [s[i] for i in range(max(map(len, steps))) for s in steps if i < len(s)]
    interleaved.append(interleaved.pop(7))  # ordinal 1 of a step, stored after its finish
    await publish(nc, topology, interleaved)
    await commit_as_the_assembler(store, interleaved)

    report = await verify_report(nc, topology, store, session)

    assert report.differences == []
    assert (report.steps, report.chunks) == (4, len(interleaved))
    outcomes = {(o.turn, o.step): o for o in await store.messages(session)}
    assert isinstance(outcomes[2, 0], ErrorEvent)  # what was checked includes the failed step
    cut = outcomes[1, 1]
    assert isinstance(cut, MessageEvent)
    assert len(cut.message.dropped_tool_calls) == 1  # and the max-tokens cut


# -- the events endpoint's resume parameters ---------------------------------------------


@pytest.mark.parametrize(
    ("query", "headers", "named"),
    [
        ("from_seq=abc", {"Last-Event-ID": "5"}, "from_seq"),
        ("from_seq=0", {"Last-Event-ID": "5"}, "from_seq"),
        ("", {"Last-Event-ID": str(MAX_SEQ)}, "Last-Event-ID"),
        ("", {"Last-Event-ID": str(2**70)}, "Last-Event-ID"),
        ("", {"Last-Event-ID": "7" * 5000}, "Last-Event-ID"),
        (f"from_seq={MAX_SEQ + 1}", {}, "from_seq"),
        (f"from_seq={'9' * 5000}", {}, "from_seq"),
    ],
    ids=[
        "bad-from-seq-beside-id",
        "zero-from-seq-beside-id",
        "id-at-max",
        "id-past-max",
        "id-5000-digits",
        "from-seq-past-max",
        "from-seq-5000-digits",
    ],
)
async def test_a_resume_position_no_stream_can_have_is_a_400_naming_it(
    base_url, query, headers, named
):
    """Both parameters are checked, and a seq past JetStream's uint64 range is refused:
    before, such a request got a 200 that (following) waited forever for nothing, and a
    5000-digit one was a 400 saying it was not an integer."""
    url = f"{base_url}/v1/sessions/{new_session()}/events?follow=false&{query}"
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(url, headers=headers)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["message"].startswith(named)
    if len(query) + sum(map(len, headers.values())) > 4000:
        assert "integer" not in error["message"]  # it is one, just too large


async def test_the_highest_resume_positions_are_accepted_and_show_nothing(nc, topology, base_url):
    session = new_session()
    await publish(nc, topology, envelopes(session)[:5])
    url = f"{base_url}/v1/sessions/{session}/events?follow=false"
    async with httpx.AsyncClient(timeout=10) as client:
        by_id = await client.get(url, headers={"Last-Event-ID": str(MAX_SEQ - 1)})
        by_seq = await client.get(f"{url}&from_seq={MAX_SEQ}")
    for response in (by_id, by_seq):
        assert response.status_code == 200
        assert "event: chunk" not in response.text
        assert ": caught up" in response.text


# -- resuming exactly after retention, across partitions --------------------------------


def sessions_on_two_partitions(topology: Topology) -> tuple[str, str]:
    first = new_session()
    while True:
        other = new_session()
        if partition_of(other, topology.partitions) != partition_of(first, topology.partitions):
            return first, other


async def sse_chunks(client: httpx.AsyncClient, url: str, headers=None) -> list[int]:
    ids: list[int] = []
    async with aconnect_sse(client, "GET", url, headers=headers or {}) as source:
        assert source.response.status_code == 200
        async for sse in source.aiter_sse():
            if sse.event == "message" and not sse.data:
                continue  # the opening "retry:" field
            assert sse.event == "chunk", sse.data
            ids.append(int(sse.id))
    return ids


async def test_resuming_after_the_stream_head_was_removed_misses_and_repeats_nothing(
    nc, topology, base_url
):
    mine, other = sessions_on_two_partitions(topology)
    a, b = envelopes(mine), envelopes(other)
    interleaved = [e for pair in zip(a, b, strict=True) for e in pair]
    await publish(nc, topology, interleaved)
    everything = await seqs_of(nc, topology, mine)
    assert everything == sorted(everything)
    assert everything[-1] - everything[0] > len(everything)  # the other session is between
    cut = everything[20]
    await nc.jetstream().purge_stream(topology.stream, seq=cut)  # what retention does
    retained = everything[20:]

    url = f"{base_url}/v1/sessions/{mine}/events?follow=false"
    async with httpx.AsyncClient(timeout=20) as client:
        whole = await sse_chunks(client, url)
        below_head = await sse_chunks(client, f"{url}&from_seq=1")
        resume_at = retained[17]
        after_id = await sse_chunks(client, url, headers={"Last-Event-ID": str(resume_at)})
        between = resume_at + 1  # a seq of the other session, or none at all
        from_between = await sse_chunks(client, f"{url}&from_seq={between}")
        # An id the purge removed resumes at the first one retained.
        after_gone = await sse_chunks(client, url, headers={"Last-Event-ID": str(cut - 5)})

    assert whole == retained
    assert below_head == retained
    assert after_id == retained[18:]
    assert from_between == retained[18:]
    assert after_gone == retained


async def test_an_eventsource_reconnecting_after_an_undecodable_chunk_gets_past_it(
    nc, topology, base_url
):
    """A payload on the session's subject that is not a chunk ends the response with
    ``event: error``. An EventSource then reconnects by itself with its last event id: before,
    the error had no id, so every reconnect (each ``retry`` ms, forever) met the same payload
    again and the client never saw the chunks after it."""
    from tokenwire.broker import chunk_subject

    session = new_session()
    sent = envelopes(session)
    await publish(nc, topology, sent[:5])
    bad = await nc.jetstream().publish(chunk_subject(topology, session, False), b"not json")
    await publish(nc, topology, sent[5:])
    url = f"{base_url}/v1/sessions/{session}/events?follow=false"

    async def once(last_id: str | None) -> list[tuple[str, str | None, str]]:
        headers = {"Last-Event-ID": last_id} if last_id else {}
        async with aconnect_sse(client, "GET", url, headers=headers) as source:
            assert source.response.status_code == 200
            return [(e.event, e.id or None, e.data) async for e in source.aiter_sse() if e.data]

    last_id: str | None = None
    seen: list[int] = []
    errors: list[dict[str, object]] = []
    async with httpx.AsyncClient(timeout=20) as client:
        for _ in range(3):  # what an EventSource does: reconnect with its last event id
            for kind, event_id, data in await once(last_id):
                last_id = event_id or last_id
                if kind == "chunk":
                    seen.append(json.loads(data)["seq"])
                else:
                    assert kind == "error"
                    errors.append(json.loads(data))

    assert len(errors) == 1
    assert str(bad.seq) in str(errors[0]["message"])
    assert errors[0]["seq"] == bad.seq
    assert seen == [s for s in await seqs_of_raw(nc, topology, session) if s != bad.seq]


async def seqs_of_raw(nc, topology: Topology, session: str) -> list[int]:
    """Every stored seq of the session, decodable or not."""
    from tokenwire.replay import stored_chunks

    return [seq async for batch in stored_chunks(nc, topology, session) for seq, _ in batch]


# -- slow readers and disconnects ---------------------------------------------------------


def short_steps(session: str, steps: int) -> tuple[list[ChunkEnvelope], dict[tuple[int, int], str]]:
    script: dict[tuple[int, int], list[StreamChunk]] = {}
    expected: dict[tuple[int, int], str] = {}
    for i in range(steps):
        text = f"Step {i} says a few words. "
        script[0, i] = [*(TextDelta(0, t) for t in split(text, 5)), Finish("stop")]
        expected[0, i] = text
    return envelopes(session, script), expected


async def test_a_paused_read_leaves_no_consumer_and_resumes_at_the_next_seq(nc, topology):
    """The queue fills and the next event cannot merge: the read pauses with its consumer
    deleted, then (once the client drained half) reads on from the next seq. Every chunk is
    accounted for exactly once (an event stands for itself and what it coalesced)."""
    session = new_session()
    sent, expected = short_steps(session, 30)
    await publish(nc, topology, sent)
    stats = SseStats()
    policy = SlowReaderPolicy(queue_bound=8, max_pause_s=60.0)
    queue = ClientQueue(policy, (1, 0), stats)
    producer = asyncio.create_task(
        produce(
            nc,
            topology,
            session,
            start=(1, 0),
            follow=False,
            queue=queue,
            policy=policy,
            stats=stats,
        )
    )
    try:

        async def paused() -> bool:
            return stats.pauses >= 1

        await until(paused, "the read paused on a full queue")
        assert await readers(nc, topology) == []  # nothing on the broker waits for the client

        events: list[ReplayEvent] = []
        while isinstance(item := await queue.take(10.0), bytes):
            events.append(queued_event(item))
        assert item.value == "end"
        await asyncio.wait_for(producer, 10)
    finally:
        producer.cancel()

    assert stats.pauses > 1
    assert stats.lagged == 0
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs))
    assert seqs[-1] == (await seqs_of(nc, topology, session))[-1]
    assert sum(1 + e.coalesced for e in events) == len(sent)
    text: dict[tuple[int, int], str] = {}
    for event in events:
        for shown in event.shown:
            if shown.__struct_config__.tag == "text":
                text[event.step_key] = text.get(event.step_key, "") + shown.text  # type: ignore[union-attr]  # a ShownText
    assert text == expected
    assert sum(s.__struct_config__.tag == "finish" for e in events for s in e.shown) == 30


async def test_a_client_that_disconnects_mid_stream_releases_its_consumer(
    nc, topology, base_url, stats
):
    session = new_session()
    await publish(nc, topology, envelopes(session)[:30])
    url = f"{base_url}/v1/sessions/{session}/events"  # following: the read stays open
    async with httpx.AsyncClient(timeout=20) as client, aconnect_sse(client, "GET", url) as source:
        got = 0
        async for sse in source.aiter_sse():
            got += sse.event == "chunk"
            if got == 5:
                # Still connected (leaving the loop closes the response): one reader.
                assert len(await readers(nc, topology)) == 1
                assert stats.clients == 1
                break

    async def released() -> bool:
        return stats.clients == 0 and await readers(nc, topology) == []

    await until(released, "the disconnected client's consumer was deleted")


async def test_a_client_waiting_on_a_quiet_session_that_disconnects_releases_its_consumer(
    nc, topology, base_url, stats
):
    url = f"{base_url}/v1/sessions/{new_session()}/events"
    async with httpx.AsyncClient(timeout=20) as client, client.stream("GET", url) as response:
        assert response.status_code == 200

        async def reading() -> bool:
            return len(await readers(nc, topology)) == 1

        await until(reading, "the follower's consumer exists")

    async def released() -> bool:
        return stats.clients == 0 and await readers(nc, topology) == []

    await until(released, "the disconnected client's consumer was deleted")
