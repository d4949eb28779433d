"""What only a real database can show, run against SQLite and PostgreSQL alike: migrations,
several store objects (as several processes would) on one database, reopening, and rows
altered with plain SQL behind the store's back."""

from __future__ import annotations

import asyncio
import sqlite3

import psycopg
import pytest

from tests.fixtures.stores import run_sql
from tokenwire.schemas import ChunkEvent, MessageEvent
from tokenwire.store import (
    PostgresStore,
    SQLiteStore,
    StoreIntegrityError,
    StoreStats,
    open_store,
    pack_chunks,
)

from .builders import error_record, message_record, text_chunks

DB_INTEGRITY = (sqlite3.IntegrityError, psycopg.errors.IntegrityError)


def opened(url: str) -> SQLiteStore | PostgresStore:
    store = open_store(url)
    assert isinstance(store, SQLiteStore | PostgresStore)
    return store


async def test_migrations_run_twice_are_no_ops(db_url: str) -> None:
    first = opened(db_url)
    try:
        assert await first.migrate() == [1, 2, 3, 4, 5]
        assert await first.migrate() == []
        await first.commit([message_record("s", 0, 0, 2)])
    finally:
        await first.close()
    second = opened(db_url)
    try:
        assert await second.migrate() == []
        assert (await second.stats()).chunks == 2
    finally:
        await second.close()
    assert run_sql(db_url, "SELECT version, name FROM schema_migrations ORDER BY version") == [
        (1, "initial"),
        (2, "session_tenant"),
        (3, "usage_ledger"),
        (4, "step_repairs"),
        (5, "routed_steps"),
    ]


async def test_two_stores_opening_at_once_migrate_once(db_url: str) -> None:
    stores = [opened(db_url) for _ in range(3)]
    try:
        applied = await asyncio.gather(*(s.migrate() for s in stores))
        assert sorted(applied) == [[], [], [1, 2, 3, 4, 5]]
        await asyncio.gather(*(s.ping() for s in stores))
    finally:
        for s in stores:
            await s.close()
    assert run_sql(db_url, "SELECT count(*) FROM schema_migrations") == [(5,)]


async def test_two_stores_committing_one_session_stay_contiguous(db_url: str) -> None:
    # Two store objects are two connections: what two assembler processes would be.
    left, right = opened(db_url), opened(db_url)
    await left.migrate()
    try:

        async def drive(store: SQLiteStore | PostgresStore, turn: int) -> None:
            for step in range(15):
                await store.commit([message_record("shared", turn, step, step % 4)])
                # Each also replays one of the other's steps: idempotent across connections.
                await store.commit([message_record("shared", 1 - turn, step // 2, (step // 2) % 4)])

        await asyncio.gather(drive(left, 0), drive(right, 1))
        events = await left.session_events("shared")
        chunk_seqs = [e.seq for e in events if isinstance(e, ChunkEvent)]
        expected_chunks = 2 * sum(step % 4 for step in range(15))
        assert chunk_seqs == list(range(1, expected_chunks + 1))
        outcomes = [e for e in events if isinstance(e, MessageEvent)]
        assert sorted((e.turn, e.step) for e in outcomes) == [
            (t, s) for t in (0, 1) for s in range(15)
        ]
        for e in outcomes:  # every message cites exactly its own chunks
            cited = [c.envelope for c in events if isinstance(c, ChunkEvent)][
                e.seq_start - 1 : e.seq_end
            ]
            assert cited == text_chunks("shared", e.turn, e.step, e.step % 4)
    finally:
        await left.close()
        await right.close()


async def test_committed_steps_survive_reopening(db_url: str) -> None:
    batch = [message_record("s", 0, 0, 3), error_record("s", 0, 1, 1)]
    first = opened(db_url)
    await first.commit(batch)
    before = await first.session_events("s")
    await first.close()
    second = opened(db_url)
    try:
        assert await second.session_events("s") == before
        assert [r.inserted for r in await second.commit(batch)] == [False, False]
        [nxt] = await second.commit([message_record("s", 0, 2, 2)])
        assert (nxt.seq_start, nxt.seq_end) == (5, 6)
    finally:
        await second.close()


async def test_an_outcome_altered_with_plain_sql_is_what_the_store_returns(db_url: str) -> None:
    store = opened(db_url)
    try:
        await store.commit([message_record("s", 0, 0, 2, text="original")])
        altered = '{"content":[{"type":"text","text":"tampered"}],"finish_reason":"stop"}'
        run_sql(
            db_url,
            "UPDATE steps SET outcome = %s WHERE session = %s AND turn = %s AND step = %s",
            (altered, "s", 0, 0),
        )
        got = await store.step_outcome("s", 0, 0)
        assert isinstance(got, MessageEvent)
        assert got.message.text == "tampered"
        run_sql(db_url, "UPDATE steps SET chunks = %s WHERE session = %s", (b"not zlib", "s"))
        with pytest.raises(StoreIntegrityError, match="damaged chunk log"):
            await store.session_events("s")
        fixed = pack_chunks(text_chunks("s", 0, 0, 2))
        run_sql(db_url, "UPDATE steps SET chunks = %s WHERE session = %s", (fixed, "s"))
        assert len(await store.session_events("s")) == 3
    finally:
        await store.close()


async def test_the_schema_guards_seq_ranges(db_url: str) -> None:
    store = opened(db_url)
    try:
        await store.commit([message_record("s", 0, 0, 2)])
    finally:
        await store.close()
    columns = (
        "session, turn, step, position, seq_start, seq_end, chunk_count, provider, model,"
        " outcome_kind, outcome, packing, chunks, first_ns, completed_ns, committed_ns"
    )
    row = ("s", 0, 9, 2, 1, 1, 1, "p", "m", "message", "{}", 1, b"", 0, 0, 0)
    marks = ", ".join(["%s"] * len(row))
    with pytest.raises(DB_INTEGRITY, match=r"(?i)unique"):  # a second step starting at seq 1
        run_sql(db_url, f"INSERT INTO steps ({columns}) VALUES ({marks})", row)
    bad_range = ("s", 0, 9, 2, 3, 9, 1, "p", "m", "message", "{}", 1, b"", 0, 0, 0)
    with pytest.raises(DB_INTEGRITY, match=r"(?i)check"):  # seq_end disagrees with chunk_count
        run_sql(db_url, f"INSERT INTO steps ({columns}) VALUES ({marks})", bad_range)
    assert run_sql(db_url, "SELECT count(*) FROM steps") == [(1,)]


async def test_many_steps_in_one_batch(db_url: str) -> None:
    store = opened(db_url)
    try:
        batch = [message_record(f"s{i % 7}", 0, i, i % 9) for i in range(400)]
        results = await store.commit(batch)
        assert all(r.inserted for r in results)
        total = sum(i % 9 for i in range(400))
        assert await store.stats() == StoreStats(
            sessions=7, steps=400, messages=400, errors=0, chunks=total
        )
        for k in range(7):
            ends = [r.seq_end for r in results if r.session == f"s{k}"]
            counts = [i % 9 for i in range(400) if i % 7 == k]
            running = [sum(counts[: j + 1]) for j in range(len(counts))]
            assert ends == running
    finally:
        await store.close()


async def test_a_routed_column_altered_into_bad_json_is_an_integrity_error(db_url: str) -> None:
    """A replay reading the store's part of a session (``replay._history``) handles store
    errors; a msgspec error let out of the store ended its reader task instead, and the
    client's events response then sent keepalives for ever."""
    store = opened(db_url)
    try:
        await store.commit([message_record("s", 0, 0, 2)])
        run_sql(db_url, "UPDATE steps SET routed = %s WHERE session = %s", ("{not json", "s"))
        with pytest.raises(StoreIntegrityError, match="damaged routed"):
            await store.messages("s")
        with pytest.raises(StoreIntegrityError, match="damaged routed"):
            await store.step_outcome("s", 0, 0)
    finally:
        await store.close()
