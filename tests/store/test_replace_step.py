"""``Store.replace_step``, the repair of a stored step, on memory, SQLite and PostgreSQL.

The oracle is the commit path: a store into which the right records were committed in the
same order must read exactly as the repaired one (events and their seqs, outcomes, session
counters, ledger lines, the rollup).
"""

from __future__ import annotations

import msgspec
import pytest

from tests.fixtures.stores import run_sql
from tests.store.builders import envelope, message_record
from tokenwire.fold import fold
from tokenwire.schemas import Finish, RecordedError, TextDelta, TokenUsage, Usage
from tokenwire.store import StepRecord, Store, open_store

SESSION = "rep-s"


def _full(step: int, n: int, *, text: str = "answer") -> StepRecord:
    """A finished step of ``n`` chunks: text, then usage, then the finish."""
    chunks = [
        envelope(SESSION, 0, step, i, TextDelta(index=0, text=f"{text}{i}")) for i in range(n - 2)
    ]
    chunks.append(envelope(SESSION, 0, step, n - 2, Usage(TokenUsage(7, n))))
    chunks.append(envelope(SESSION, 0, step, n - 1, Finish(reason="stop")))
    return StepRecord(
        SESSION,
        0,
        step,
        "openai",
        "gpt-4o-mini",
        chunks,
        fold([c.chunk for c in chunks]),
        completed_ns=chunks[-1].time_ns,
    )


def _abandoned(full: StepRecord, kept: int) -> StepRecord:
    """What an assembler that fell behind stored: the first ``kept`` chunks, abandoned."""
    error = RecordedError(kind="abandoned", message="no finish and no new chunk for 120 s")
    return msgspec.structs.replace(
        full, chunks=full.chunks[:kept], outcome=error, completed_ns=full.completed_ns + 120 * 10**9
    )


async def _snapshot(store: Store) -> tuple[object, ...]:
    return (
        await store.session_events(SESSION),
        await store.messages(SESSION),
        await store.session(SESSION),
        await store.session_usage(SESSION),
        await store.usage("model"),
        await store.stats(),
        await store.session_events("other"),
    )


async def _clean(records: list[StepRecord]) -> tuple[object, ...]:
    oracle = open_store("memory://")
    try:
        for record in records:
            await oracle.commit([record])
        return await _snapshot(oracle)
    finally:
        await oracle.close()


@pytest.mark.parametrize(("stored_chunks", "right_chunks"), [(1, 6), (6, 3)])
async def test_a_replaced_step_reads_as_if_committed_right(
    store: Store, stored_chunks: int, right_chunks: int
) -> None:
    """A step in the middle of its session grows (or shrinks): the later steps move, the
    seqs stay contiguous, the ledger and the counters follow, another session is untouched."""
    before, after = _full(0, 4), _full(2, 5)
    right = _full(1, right_chunks, text="whole")
    wrong = (
        _abandoned(right, stored_chunks)
        if stored_chunks < right_chunks
        else _full(1, stored_chunks, text="wrong")
    )
    other = message_record("other", 0, 0, 3)
    for record in (before, wrong, other, after):
        await store.commit([record])

    repair = await store.replace_step(right)

    assert repair is not None
    assert repair.replaced
    assert (repair.before_chunks, repair.after_chunks) == (stored_chunks, right_chunks)
    assert (repair.after_kind, repair.seq_start, repair.moved_steps) == ("message", 5, 1)
    clean = await _clean([before, right, other, after])
    assert await _snapshot(store) == clean

    again = await store.replace_step(right)  # the second run changes nothing
    assert again is not None
    assert not again.replaced
    assert await _snapshot(store) == clean


async def test_an_outcome_alone_is_replaced_without_moving_anything(store: Store) -> None:
    right = _full(0, 5)
    wrong = msgspec.structs.replace(right, outcome=RecordedError(kind="gap", message="x"))
    later = _full(1, 3)
    await store.commit([wrong, later])
    repair = await store.replace_step(right)
    assert repair is not None
    assert (repair.replaced, repair.moved_steps) == (True, 0)
    assert (repair.before_kind, repair.after_kind) == ("error", "message")
    assert await _snapshot(store) == await _clean([right, later])


async def test_a_step_not_stored_is_not_replaced(store: Store) -> None:
    await store.commit([_full(0, 4)])
    assert await store.replace_step(_full(1, 4)) is None
    assert await _snapshot(store) == await _clean([_full(0, 4)])


async def test_each_repair_is_logged_with_what_the_step_held(db_url: str) -> None:
    store = open_store(db_url)
    right = _full(0, 6)
    try:
        await store.commit([_abandoned(right, 2), _full(1, 3)])
        await store.replace_step(right)
        await store.replace_step(right)  # no change, no second row
    finally:
        await store.close()
    columns = "session, turn, step, before_kind, before_chunks, after_kind, after_chunks"
    rows = run_sql(db_url, f"SELECT {columns}, moved_steps, before_outcome FROM step_repairs")
    assert [r[:8] for r in rows] == [(SESSION, 0, 0, "error", 2, "message", 6, 1)]
    assert '"kind":"abandoned"' in rows[0][8]
