"""read_session against a real nats-server: what the user saw, resume ids, live tail, pacing."""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest

from tests.replay.sessions import (
    CALLS_0,
    ERROR_3,
    EXPECTED_REASONING,
    EXPECTED_TEXT,
    SCRIPT,
    TTFC_NS,
    envelopes,
    publish,
    seen,
)
from tokenwire.broker import Topology
from tokenwire.replay import (
    InvalidSessionId,
    ReplayEvent,
    ReplayStalled,
    ShownError,
    ShownFinish,
    paced,
    read_session,
)
from tokenwire.schemas import TextDelta, Usage


def new_session() -> str:
    return f"s-{uuid.uuid4().hex[:12]}"


async def collect(nc, topology: Topology, session: str, from_seq: int | None = None):
    return [e async for e in read_session(nc, topology, session, from_seq)]


async def test_replay_shows_exactly_the_scripted_session(nc, topology):
    session = new_session()
    sent = envelopes(session)
    await publish(nc, topology, sent)

    events = await collect(nc, topology, session)

    assert len(events) == len(sent)  # one event per retained chunk
    assert [e.envelope for e in events] == sent
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    got = seen(events)
    assert dict(got.text) == EXPECTED_TEXT  # character for character
    assert dict(got.reasoning) == EXPECTED_REASONING
    assert got.calls[0, 0] == list(CALLS_0)
    assert got.calls.get((1, 1), []) == []  # the truncated call is never shown
    assert isinstance(SCRIPT[0, 0][-2], Usage)
    assert got.ends[0, 0] == ShownFinish("tool-calls", SCRIPT[0, 0][-2].usage)
    assert isinstance(got.ends[1, 1], ShownFinish)
    assert got.ends[1, 1].dropped_tool_calls == 1
    assert isinstance(got.ends[2, 0], ShownError)
    assert got.ends[2, 0].error.message == ERROR_3.message
    assert got.ends[2, 0].error.kind == "provider"
    assert got.ttfc == {key: TTFC_NS / 1e9 for key in SCRIPT}


async def test_tool_calls_show_only_once_complete(nc, topology):
    session = new_session()
    await publish(nc, topology, envelopes(session))
    events = await collect(nc, topology, session)
    first_call = next(
        i
        for i, e in enumerate(events)
        if any(s.__struct_config__.tag == "tool-call" for s in e.shown)
    )
    # It shows on the chunk that carried its block-end, not on any fragment before it.
    assert events[first_call].envelope.chunk.__struct_config__.tag == "block-end"


async def test_out_of_order_publish_is_reassembled_by_ordinal(nc, topology):
    session = new_session()
    sent = envelopes(session)
    swapped = list(sent)
    # A retried publish landing late: ordinals 5 and 6 of step (1, 0) stored after 9.
    idx = {(e.turn, e.step, e.ordinal): i for i, e in enumerate(sent)}
    late = [swapped.pop(idx[1, 0, 5]), swapped.pop(idx[1, 0, 6] - 1)]
    at = next(i for i, e in enumerate(swapped) if (e.turn, e.step, e.ordinal) == (1, 0, 9))
    swapped[at + 1 : at + 1] = late
    await publish(nc, topology, swapped)

    events = await collect(nc, topology, session)

    assert [e.envelope for e in events] == swapped  # stored out of order...
    assert dict(seen(events).text) == EXPECTED_TEXT  # ...shown in order
    held = [
        e
        for e in events
        if (e.envelope.turn, e.envelope.step) == (1, 0) and e.envelope.ordinal in (7, 8, 9)
    ]
    assert all(e.shown == () for e in held)  # waiting for 5 and 6


async def test_resuming_after_the_last_id_misses_and_repeats_nothing(nc, topology):
    session = new_session()
    sent = envelopes(session)
    await publish(nc, topology, sent)
    everything = await collect(nc, topology, session)

    first_part = []
    async with contextlib.aclosing(read_session(nc, topology, session, follow=True)) as live:
        async for event in live:
            first_part.append(event)
            if len(first_part) == 37:
                break
    rest = await collect(nc, topology, session, from_seq=first_part[-1].seq + 1)

    assert [e.seq for e in first_part + rest] == [e.seq for e in everything]
    assert [e.envelope for e in first_part + rest] == sent


async def test_tail_follows_chunks_published_after_it_started(nc, topology):
    session = new_session()
    sent = envelopes(session)
    await publish(nc, topology, sent[:10])
    received: list[ReplayEvent] = []

    async def tail() -> None:
        async with contextlib.aclosing(read_session(nc, topology, session, follow=True)) as it:
            async for event in it:
                received.append(event)
                if len(received) == len(sent):
                    return

    task = asyncio.create_task(tail())
    await asyncio.sleep(0.2)
    await publish(nc, topology, sent[10:])
    await asyncio.wait_for(task, 20)
    assert [e.envelope for e in received] == sent


async def test_unknown_session_replays_nothing_and_invalid_id_is_refused(nc, topology):
    assert await collect(nc, topology, new_session()) == []
    with pytest.raises(InvalidSessionId):
        await collect(nc, topology, "not a session")


async def test_paced_keeps_the_original_timing_scaled_and_caps_long_gaps():
    from tokenwire.schemas import ChunkEnvelope

    times_s = [0.0, 0.1, 0.3, 0.3, 100.3]  # a 100 s pause between turns
    envs = [
        ChunkEnvelope("s", 0, 0, i, int(t * 1e9), "p", "m", TextDelta(0, "x"))
        for i, t in enumerate(times_s)
    ]
    events = [ReplayEvent(i + 1, e) for i, e in enumerate(envs)]
    now = [0.0]
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(round(seconds, 6))
        now[0] += seconds

    async def source():
        for e in events:
            yield e

    out = [e async for e in paced(source(), 2.0, max_gap_s=5.0, clock=lambda: now[0], sleep=sleep)]
    assert out == events
    assert slept == [0.05, 0.1, 2.5]  # 0.1/2, 0.2/2, nothing for 0, min(100, 5)/2
    assert [e async for e in paced(source(), None, sleep=sleep)] == events


async def test_an_undecodable_payload_stops_the_read_at_its_seq_and_can_be_skipped(nc, topology):
    from tokenwire.broker import chunk_subject
    from tokenwire.replay import UndecodableChunk

    session = new_session()
    sent = envelopes(session)
    await publish(nc, topology, sent[:5])
    ack = await nc.jetstream().publish(chunk_subject(topology, session, False), b"not json")
    await publish(nc, topology, sent[5:])

    with pytest.raises(UndecodableChunk) as caught:
        await collect(nc, topology, session)
    assert caught.value.seq == ack.seq
    rest = await collect(nc, topology, session, from_seq=ack.seq + 1)
    assert [e.envelope for e in rest] == sent[5:]
    assert dict(seen(rest).text) == EXPECTED_TEXT  # the earlier chunks rendered silently


class _LaggingReplica:
    """The read's consumer placed on a replica ``behind`` messages behind the stream's leader
    (a node just restarted, catching up): its count misses them and, with ``never``, it never
    delivers them either. Everything else is the real consumer on the real server."""

    def __init__(self, behind: int, never: bool = False) -> None:
        self.behind, self.never = behind, never

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import tokenwire.broker._batches as source
        from tokenwire.broker._bounded import BoundedRead  # what _batches reads with

        behind, never = self.behind, self.never

        class OnALaggingReplica(BoundedRead):
            async def open(self) -> int:
                return max(0, await super().open() - behind)  # the replica's count

            def _on_delivery(self, subject, reply, data, hdr):
                if never and int(reply.split(b".")[-1]) < behind:
                    return  # the replica never gets the last ``behind`` messages
                super()._on_delivery(subject, reply, data, hdr)

        monkeypatch.setattr(source, "BoundedRead", OnALaggingReplica)


async def test_a_read_on_a_lagging_replica_waits_for_what_the_leader_holds(
    nc, topology, monkeypatch
):
    """docs/reliability.md: a replay right after a node restart counted what its replica held
    and ended short. What is due now comes from the stream's leader."""
    session = new_session()
    sent = envelopes(session)
    await publish(nc, topology, sent)
    _LaggingReplica(behind=5).install(monkeypatch)

    events = await collect(nc, topology, session)

    assert [e.envelope for e in events] == sent


async def test_a_replica_that_never_catches_up_ends_the_read_with_a_typed_error(
    nc, topology, monkeypatch
):
    session = new_session()
    sent = envelopes(session)
    await publish(nc, topology, sent)
    _LaggingReplica(behind=3, never=True).install(monkeypatch)

    events = read_session(nc, topology, session, idle_timeout_s=0.5)
    with pytest.raises(ReplayStalled) as caught:
        [e async for e in events]
    assert caught.value.session == session
