"""The Store contract, run against every backend: memory, a SQLite file and PostgreSQL.

Expected ranges and events are written out in the tests or built by a running counter over the
records (an oracle independent of the store's planner); never read back from the store first.
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from tokenwire.schemas import (
    ChunkEvent,
    ErrorEvent,
    ImageBlock,
    Message,
    MessageEvent,
    ReasoningBlock,
    RecordedError,
    SessionEvent,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallBlock,
    ToolResultBlock,
)
from tokenwire.store import CommittedStep, StepRecord, Store, StoreIntegrityError, StoreStats
from tokenwire.store import StoreUnavailable as Unavailable

from .builders import BASE_NS, envelope, error_record, full_step_chunks, message_record


def expected_events(records: list[StepRecord]) -> dict[str, list[SessionEvent]]:
    """The oracle: each session's events if ``records`` (no duplicates) were committed in
    this order. A running counter per session; outcome after the step's chunks."""
    last: dict[str, int] = {}
    out: dict[str, list[SessionEvent]] = {}
    for r in records:
        start = last.get(r.session, 0) + 1
        events = out.setdefault(r.session, [])
        events += [ChunkEvent(seq=start + i, envelope=c) for i, c in enumerate(r.chunks)]
        end = start + len(r.chunks) - 1
        last[r.session] = end
        cite = (r.session, r.turn, r.step, start, end, r.provider, r.model)
        if isinstance(r.outcome, Message):
            events.append(MessageEvent(*cite, message=r.outcome))
        else:
            events.append(ErrorEvent(*cite, error=r.outcome))
    return out


def kind(event: SessionEvent) -> str:
    """The wire tag of an event (msgspec keeps tags off the attributes)."""
    return {ChunkEvent: "chunk", MessageEvent: "message", ErrorEvent: "error"}[type(event)]


def placed(results: list[CommittedStep]) -> list[CommittedStep]:
    """Commit results without their ledger lines (tests/store/test_ledger.py checks those)."""
    return [msgspec.structs.replace(r, usage=None) for r in results]


def seqs(events: list[SessionEvent]) -> list[int]:
    return [e.seq for e in events if isinstance(e, ChunkEvent)]


async def snapshot(store: Store, sessions: list[str]) -> tuple[object, ...]:
    return (
        await store.stats(),
        await store.sessions(limit=1000),
        [await store.session_events(s) for s in sessions],
        [await store.messages(s) for s in sessions],
    )


# -- sequence assignment ----------------------------------------------------------------------


async def test_one_batch_interleaving_sessions_gets_contiguous_ranges(store: Store) -> None:
    batch = [
        message_record("s1", 0, 0, 3),
        message_record("s2", 0, 0, 2),
        error_record("s1", 0, 1, 0),
        message_record("s1", 0, 2, 4),
        message_record("s2", 1, 0, 1),
        message_record("s3", 0, 0, 0),
    ]
    results = await store.commit(batch)
    assert placed(results) == [
        CommittedStep("s1", 0, 0, 1, 3, "message", True),
        CommittedStep("s2", 0, 0, 1, 2, "message", True),
        CommittedStep("s1", 0, 1, 4, 3, "error", True),
        CommittedStep("s1", 0, 2, 4, 7, "message", True),
        CommittedStep("s2", 1, 0, 3, 3, "message", True),
        CommittedStep("s3", 0, 0, 1, 0, "message", True),
    ]
    oracle = expected_events(batch)
    for session in ("s1", "s2", "s3"):
        assert await store.session_events(session) == oracle[session]
    assert seqs(await store.session_events("s1")) == [1, 2, 3, 4, 5, 6, 7]


async def test_ranges_continue_across_many_batches(store: Store) -> None:
    committed: list[StepRecord] = []
    for batch_no in range(6):
        batch = [
            message_record(f"s{k}", batch_no, step, (batch_no + step + k) % 5)
            for k in range(4)
            for step in range(3)
        ]
        await store.commit(batch)
        committed += batch
    oracle = expected_events(committed)
    for k in range(4):
        events = await store.session_events(f"s{k}")
        assert events == oracle[f"s{k}"]
        assert seqs(events) == list(range(1, len(seqs(events)) + 1))
    total_chunks = sum(len(r.chunks) for r in committed)
    assert await store.stats() == StoreStats(
        sessions=4, steps=72, messages=72, errors=0, chunks=total_chunks
    )


async def test_steps_without_chunks_take_an_empty_range(store: Store) -> None:
    results = await store.commit(
        [
            error_record("s", 0, 0, 0),  # before any chunk
            message_record("s", 0, 1, 2),
            error_record("s", 0, 2, 0),  # between chunks
            error_record("s", 0, 3, 0),  # two empty ones in a row
            message_record("s", 0, 4, 1),
        ]
    )
    assert [(r.seq_start, r.seq_end) for r in results] == [(1, 0), (1, 2), (3, 2), (3, 2), (3, 3)]
    kinds = [type(e).__name__ for e in await store.session_events("s")]
    assert kinds == [
        "ErrorEvent",
        "ChunkEvent",
        "ChunkEvent",
        "MessageEvent",
        "ErrorEvent",
        "ErrorEvent",
        "ChunkEvent",
        "MessageEvent",
    ]
    [only] = await store.commit([error_record("t", 0, 0, 0)])
    assert (only.seq_start, only.seq_end) == (1, 0)
    assert [e.step for e in await store.messages("t")] == [0]


# -- idempotency ------------------------------------------------------------------------------


async def test_same_batch_twice_leaves_the_store_as_one_commit(store: Store) -> None:
    batch = [message_record("a", 0, 0, 3), error_record("a", 0, 1, 2), message_record("b", 0, 0, 1)]
    first = await store.commit(batch)
    before = await snapshot(store, ["a", "b"])
    second = await store.commit(batch)
    assert placed(second) == [
        CommittedStep("a", 0, 0, 1, 3, "message", False),
        CommittedStep("a", 0, 1, 4, 5, "error", False),
        CommittedStep("b", 0, 0, 1, 1, "message", False),
    ]
    assert [r.inserted for r in first] == [True, True, True]
    assert await snapshot(store, ["a", "b"]) == before
    assert await store.stats() == StoreStats(sessions=2, steps=3, messages=2, errors=1, chunks=6)


async def test_partial_overlap_writes_only_the_new_steps(store: Store) -> None:
    a, b, c = (
        message_record("s", 0, 0, 3),
        message_record("s", 0, 1, 2),
        message_record("s", 1, 0, 4),
    )
    await store.commit([a, b])
    # A redelivered step may arrive with different content: the first write wins.
    b_again = message_record("s", 0, 1, 2, text="changed on replay")
    results = await store.commit([b_again, c])
    assert placed(results) == [
        CommittedStep("s", 0, 1, 4, 5, "message", False),
        CommittedStep("s", 1, 0, 6, 9, "message", True),
    ]
    assert await store.session_events("s") == expected_events([a, b, c])["s"]


async def test_duplicate_inside_one_batch_is_written_once(store: Store) -> None:
    a = message_record("s", 0, 0, 2)
    a_dup = error_record("s", 0, 0, 5)
    b = message_record("s", 0, 1, 1)
    results = await store.commit([a, a_dup, b])
    assert placed(results) == [
        CommittedStep("s", 0, 0, 1, 2, "message", True),
        CommittedStep("s", 0, 0, 1, 2, "message", False),
        CommittedStep("s", 0, 1, 3, 3, "message", True),
    ]
    assert await store.session_events("s") == expected_events([a, b])["s"]
    assert await store.stats() == StoreStats(sessions=1, steps=2, messages=2, errors=0, chunks=3)


async def test_a_malformed_record_fails_the_whole_batch(store: Store) -> None:
    good = message_record("s", 0, 0, 2)
    foreign = StepRecord(
        "s", 0, 1, "openai", "m", message_record("other", 0, 1, 1).chunks, good.outcome, 1
    )
    with pytest.raises(StoreIntegrityError) as info:
        await store.commit([good, foreign])
    assert (info.value.session, info.value.turn, info.value.step) == ("s", 0, 1)
    backwards = StepRecord("s", 0, 2, "openai", "m", list(reversed(good.chunks)), good.outcome, 1)
    with pytest.raises(StoreIntegrityError):
        await store.commit([backwards])
    assert await store.stats() == StoreStats(sessions=0, steps=0, messages=0, errors=0, chunks=0)
    assert await store.commit([]) == []


async def test_a_gap_step_keeps_its_ordinals(store: Store) -> None:
    chunks = [envelope("s", 0, 0, o, TextDelta(index=0, text=str(o))) for o in (0, 1, 3)]
    gap = RecordedError(kind="gap", message="ordinal 2 never arrived")
    await store.commit([StepRecord("s", 0, 0, "openai", "m", chunks, gap, BASE_NS)])
    events = await store.session_events("s")
    assert [(e.seq, e.envelope.ordinal) for e in events if isinstance(e, ChunkEvent)] == [
        (1, 0),
        (2, 1),
        (3, 3),
    ]


# -- round trips ------------------------------------------------------------------------------


async def test_message_round_trips_field_by_field(store: Store) -> None:
    message = Message(
        content=[
            ReasoningBlock(text="think", signature="sig=="),
            ReasoningBlock(text="", redacted="opaque"),
            TextBlock(text="Hi ✓"),
            ToolCallBlock(id="call_1", name="search", arguments='{"q": "x", "n": 2}'),
            ToolResultBlock(tool_call_id="call_0", content="42", is_error=True),
            ImageBlock(media_type="image/png", url="https://example.com/a.png"),
        ],
        finish_reason="max-tokens",
        usage=TokenUsage(input_tokens=11, output_tokens=7, reasoning_tokens=3),
        replay_state={"encrypted": "abc", "items": [1, None, {"k": True}]},
        dropped_tool_calls=[ToolCallBlock(id="call_2", name="run", arguments='{"cmd": "l')],
        ignored_deltas=2,
    )
    chunks = full_step_chunks("s")
    await store.commit([StepRecord("s", 0, 0, "openai", "gpt-4o-mini", chunks, message, 99)])
    got = await store.step_outcome("s", 0, 0)
    assert isinstance(got, MessageEvent)
    assert (got.session, got.turn, got.step) == ("s", 0, 0)
    assert (got.seq_start, got.seq_end, got.provider, got.model) == (1, 5, "openai", "gpt-4o-mini")
    m = got.message
    assert m.role == "assistant"
    assert m.finish_reason == "max-tokens"
    assert m.content[0] == ReasoningBlock(text="think", signature="sig==", redacted=None)
    assert m.content[1] == ReasoningBlock(text="", signature=None, redacted="opaque")
    assert m.content[2] == TextBlock(text="Hi ✓")
    assert m.content[3] == ToolCallBlock(id="call_1", name="search", arguments='{"q": "x", "n": 2}')
    assert m.content[4] == ToolResultBlock(tool_call_id="call_0", content="42", is_error=True)
    assert m.content[5] == ImageBlock(
        media_type="image/png", data=None, url="https://example.com/a.png"
    )
    assert len(m.content) == 6
    assert m.usage == TokenUsage(input_tokens=11, output_tokens=7, reasoning_tokens=3)
    assert m.usage.cache_read_tokens is None
    assert m.replay_state == {"encrypted": "abc", "items": [1, None, {"k": True}]}
    assert m.dropped_tool_calls == [ToolCallBlock(id="call_2", name="run", arguments='{"cmd": "l')]
    assert m.ignored_deltas == 2
    events = await store.session_events("s")
    assert [e.envelope for e in events if isinstance(e, ChunkEvent)] == chunks
    assert isinstance(events[0], ChunkEvent)
    assert events[0].envelope.request_time_ns == chunks[0].time_ns - 250_000_000
    assert isinstance(events[1], ChunkEvent)
    assert events[1].envelope.chunk == TextDelta(index=0, text="héllo \u0000 wörld")


async def test_error_round_trips_field_by_field(store: Store) -> None:
    error = RecordedError(
        kind="abandoned",
        message="no finish within 30 s",
        retryable=True,
        code="abandon_timeout",
        usage=TokenUsage(input_tokens=5, cache_write_tokens=9),
    )
    chunks = message_record("s", 2, 3, 2).chunks
    await store.commit([StepRecord("s", 2, 3, "deepseek", "deepseek-chat", chunks, error, 5)])
    got = await store.step_outcome("s", 2, 3)
    assert isinstance(got, ErrorEvent)
    assert (got.session, got.turn, got.step, got.seq_start, got.seq_end) == ("s", 2, 3, 1, 2)
    assert (got.provider, got.model) == ("deepseek", "deepseek-chat")
    assert got.error.kind == "abandoned"
    assert got.error.message == "no finish within 30 s"
    assert got.error.retryable is True
    assert got.error.code == "abandon_timeout"
    assert got.error.usage == TokenUsage(input_tokens=5, cache_write_tokens=9)
    assert await store.step_outcome("s", 2, 4) is None
    assert await store.step_outcome("nobody", 0, 0) is None


# -- reading ----------------------------------------------------------------------------------


async def test_session_events_ranges(store: Store) -> None:
    # seqs: step0 1..3, step1 (empty) sits at 4, step2 4..5
    batch = [message_record("s", 0, 0, 3), error_record("s", 0, 1, 0), message_record("s", 0, 2, 2)]
    await store.commit(batch)
    full = await store.session_events("s")
    assert len(full) == 8

    def shape(events: list[SessionEvent]) -> list[str]:
        return [f"c{e.seq}" if isinstance(e, ChunkEvent) else f"{kind(e)}{e.step}" for e in events]

    assert shape(full) == ["c1", "c2", "c3", "message0", "error1", "c4", "c5", "message2"]
    assert shape(await store.session_events("s", 2, 3)) == ["c2", "c3", "message0"]
    assert shape(await store.session_events("s", 2, 2)) == ["c2"]
    assert shape(await store.session_events("s", 4)) == ["error1", "c4", "c5", "message2"]
    assert shape(await store.session_events("s", 5, 100)) == ["c5", "message2"]
    assert await store.session_events("s", 6) == []
    assert await store.session_events("nobody") == []
    for split in range(0, 7):  # adjacent ranges partition the events exactly
        head = await store.session_events("s", 1, split)
        tail = await store.session_events("s", split + 1)
        assert head + tail == full, split


async def test_messages_are_in_seq_order(store: Store) -> None:
    await store.commit([message_record("s", 1, 0, 2), error_record("s", 0, 5, 0)])
    await store.commit([message_record("s", 0, 0, 1)])
    got = await store.messages("s")
    assert [(kind(e), e.turn, e.step, e.seq_start, e.seq_end) for e in got] == [
        ("message", 1, 0, 1, 2),
        ("error", 0, 5, 3, 2),
        ("message", 0, 0, 3, 3),
    ]
    assert await store.messages("nobody") == []


async def test_sessions_and_stats(store: Store) -> None:
    await store.commit(
        [
            message_record("old", 0, 0, 2, completed_ns=BASE_NS + 10),
            error_record("old", 0, 1, 1, completed_ns=BASE_NS + 20),
            message_record("new", 0, 0, 3, completed_ns=BASE_NS + 500),
            message_record("mid", 0, 0, 0, completed_ns=BASE_NS + 300),
        ]
    )
    summaries = await store.sessions()
    assert [s.session for s in summaries] == ["new", "mid", "old"]
    old = summaries[2]
    assert (old.steps, old.messages, old.errors, old.chunks, old.last_seq) == (2, 1, 1, 3, 3)
    assert old.first_ns == BASE_NS  # the first chunk's time (turn 0, step 0, ordinal 0)
    assert old.last_ns == BASE_NS + 20
    mid = summaries[1]
    assert (mid.chunks, mid.last_seq, mid.first_ns, mid.last_ns) == (
        0,
        0,
        BASE_NS + 300,
        BASE_NS + 300,
    )
    assert [s.session for s in await store.sessions(limit=1, offset=1)] == ["mid"]
    assert await store.sessions(limit=10, offset=3) == []
    assert await store.stats() == StoreStats(sessions=3, steps=4, messages=3, errors=1, chunks=6)


def _owned(record: StepRecord, tenant: str) -> StepRecord:
    """``record`` whose first chunk names ``tenant`` (what the gateway writes for a tenant key)."""
    first = msgspec.structs.replace(record.chunks[0], key_name=f"{tenant}-key", tenant=tenant)
    return msgspec.structs.replace(record, chunks=[first, *record.chunks[1:]])


async def test_a_session_takes_the_tenant_of_its_first_stored_step(store: Store) -> None:
    await store.commit([_owned(message_record("a1", 0, 0, 2, completed_ns=BASE_NS + 1), "team-a")])
    await store.commit(
        [
            _owned(message_record("a1", 0, 1, 1, completed_ns=BASE_NS + 2), "team-b"),  # later
            _owned(message_record("b1", 0, 0, 1, completed_ns=BASE_NS + 3), "team-b"),
            message_record("none", 0, 0, 1, completed_ns=BASE_NS + 4),
            _owned(message_record("a2", 0, 0, 1, completed_ns=BASE_NS + 5), "team-a"),
        ]
    )
    a1, b1, none = [await store.session(name) for name in ("a1", "b1", "none")]
    assert a1 is not None
    assert (a1.tenant, a1.steps) == ("team-a", 2)
    assert b1 is not None
    assert b1.tenant == "team-b"
    assert none is not None
    assert none.tenant is None
    assert await store.session("unknown") is None
    assert [s.session for s in await store.sessions(tenant="team-a")] == ["a2", "a1"]
    assert [s.session for s in await store.sessions(tenant="team-b")] == ["b1"]
    assert await store.sessions(tenant="team-c") == []
    assert [s.session for s in await store.sessions(tenant="team-a", limit=1, offset=1)] == ["a1"]
    assert len(await store.sessions()) == 4


# -- rebuild ----------------------------------------------------------------------------------


async def test_delete_session_resets_only_that_session(store: Store) -> None:
    await store.commit([message_record("a", 0, 0, 2), message_record("a", 0, 1, 1)])
    await store.commit([message_record("b", 0, 0, 4)])
    assert await store.delete_session("a") == 2
    assert await store.delete_session("a") == 0
    assert await store.session_events("a") == []
    assert await store.step_outcome("a", 0, 0) is None
    assert seqs(await store.session_events("b")) == [1, 2, 3, 4]
    [again] = await store.commit([message_record("a", 0, 1, 1)])
    assert (again.seq_start, again.seq_end, again.inserted) == (1, 1, True)
    assert await store.stats() == StoreStats(sessions=2, steps=2, messages=2, errors=0, chunks=5)


async def test_truncate_empties_the_store(store: Store) -> None:
    await store.commit([message_record("a", 0, 0, 2), error_record("b", 0, 0, 1)])
    await store.truncate()
    assert await store.stats() == StoreStats(sessions=0, steps=0, messages=0, errors=0, chunks=0)
    assert await store.sessions() == []
    [again] = await store.commit([message_record("a", 0, 0, 2)])
    assert (again.seq_start, again.seq_end, again.inserted) == (1, 2, True)


# -- concurrency and lifecycle ----------------------------------------------------------------


async def test_concurrent_commits_of_different_sessions(store: Store) -> None:
    sessions = [f"c{i:02d}" for i in range(12)]

    async def drive(session: str) -> list[CommittedStep]:
        out = []
        for step in range(5):
            out += await store.commit([message_record(session, 0, step, (step * 3) % 4 + 1)])
        return out

    results = await asyncio.gather(*(drive(s) for s in sessions))
    for session, committed in zip(sessions, results, strict=True):
        expected_ends = [1, 5, 8, 10, 11]  # chunk counts 1, 4, 3, 2, 1
        assert [r.seq_end for r in committed] == expected_ends
        assert seqs(await store.session_events(session)) == list(range(1, 12))
    assert (await store.stats()).steps == 60


async def test_ping_then_close_makes_the_store_unusable(store: Store) -> None:
    await store.ping()
    await store.close()
    await store.close()  # idempotent
    with pytest.raises(Unavailable):
        await store.commit([message_record("s", 0, 0, 1)])
    with pytest.raises(Unavailable):
        await store.session_events("s")
