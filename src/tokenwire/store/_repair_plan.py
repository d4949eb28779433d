"""The repair planner: how a stored step becomes the step re-derived from the broker.

Pure and shared by every backend, as the commit planner is. ``tokenwire rebuild --repair``
hands :meth:`Store.replace_step` the record the assembler's core folds from the retained
chunks; the backend prices its ledger line (before the transaction), opens ONE transaction,
locks the session row, loads the stored row, calls :func:`plan_repair` and, when it returns
a plan:

1. moves the session's later steps (``position > row.position``) by ``plan.shift`` seqs, in
   two statements through :data:`SHIFT_OFFSET` (so the unique ``(session, seq_start)`` index
   never sees two rows at one seq while they move);
2. writes ``plan.row`` over the stored row (same position and ``seq_start``);
3. replaces the step's ledger line: the old one is taken out of the rollup, the new one added;
4. writes the session's counters (``plan.session``; its first and last times are recomputed
   from its rows);
5. appends ``plan.log`` to ``step_repairs`` (what the row held before, for audit).

The session's seqs stay contiguous and every outcome still cites its own chunks; a step's
position never changes, so the order of the session's steps is kept.
"""

from __future__ import annotations

import msgspec

from tokenwire.ledger import StepUsage
from tokenwire.store._backend_rows import SessionState, StepRow
from tokenwire.store._commit_plan import step_routed
from tokenwire.store._errors import StoreIntegrityError
from tokenwire.store._packing import (
    PACKING_ZLIB_JSON,
    decode_outcome,
    encode_outcome,
    pack_chunks,
    unpack_chunks,
)
from tokenwire.store._records import OutcomeKind, StepRecord, StepRepair

SHIFT_OFFSET = 2**61
"""Added to the later steps' seqs before they are moved back down by it plus the shift: far
above any seq a session reaches, below the 64-bit columns' limit."""

REPAIR_COLUMNS = (
    "session",
    "turn",
    "step",
    "repaired_ns",
    "before_kind",
    "before_outcome",
    "before_chunks",
    "after_kind",
    "after_chunks",
    "moved_steps",
)
"""The columns of ``step_repairs``, in the order of :meth:`RepairPlan.log_values`."""


class RepairPlan(msgspec.Struct, frozen=True):
    """What one repair writes (see the module): the new ``row``, the ``shift`` of the later
    steps' seqs, the session's counters after, the new ledger ``line`` and the ``result``."""

    row: StepRow
    shift: int
    session: SessionState
    line: StepUsage
    result: StepRepair
    before_outcome: str

    def log_values(self) -> tuple[object, ...]:
        """The ``step_repairs`` row, in :data:`REPAIR_COLUMNS` order."""
        r = self.result
        return (
            r.session,
            r.turn,
            r.step,
            self.row.committed_ns,
            r.before_kind,
            self.before_outcome,
            r.before_chunks,
            r.after_kind,
            r.after_chunks,
            r.moved_steps,
        )


def holds(row: StepRow, record: StepRecord) -> bool:
    """Whether the stored row already holds the record's outcome and chunk log (a damaged,
    undecodable row does not)."""
    try:
        return decode_outcome(row.outcome_kind, row.outcome) == record.outcome and (
            unpack_chunks(row.chunks, row.packing) == record.chunks
        )
    except StoreIntegrityError:
        return False


def unchanged(row: StepRow) -> StepRepair:
    """The result for a row that already holds the record."""
    kind = _kind(row.outcome_kind)
    return StepRepair(
        row.session,
        row.turn,
        row.step,
        False,
        kind,
        row.chunk_count,
        kind,
        row.chunk_count,
        row.seq_start,
    )


def plan_repair(
    row: StepRow,
    record: StepRecord,
    state: SessionState,
    *,
    later_steps: int,
    line: StepUsage,
    repaired_ns: int,
) -> RepairPlan | None:
    """The plan that makes ``row`` hold ``record``; None when it already does.

    ``state`` is the session's locked row, ``later_steps`` how many of its steps come after
    this one (they move), ``line`` the record's ledger line (priced by the caller).
    """
    if holds(row, record):
        return None
    count = len(record.chunks)
    routed = step_routed(record)
    new = msgspec.structs.replace(
        row,
        seq_end=row.seq_start + count - 1,
        chunk_count=count,
        provider=record.provider,
        model=record.model,
        outcome_kind=record.outcome_kind,
        outcome=encode_outcome(record.outcome),
        packing=PACKING_ZLIB_JSON,
        chunks=pack_chunks(record.chunks),
        first_ns=record.chunks[0].time_ns if record.chunks else record.completed_ns,
        completed_ns=record.completed_ns,
        committed_ns=repaired_ns,
        deployment=routed.deployment if routed is not None else None,
        routed=msgspec.json.encode(routed).decode() if routed is not None else None,
    )
    shift = count - row.chunk_count
    after = msgspec.structs.replace(
        state, last_seq=state.last_seq + shift, chunks=state.chunks + shift
    )
    if row.outcome_kind != new.outcome_kind:
        moved = 1 if new.outcome_kind == "message" else -1
        after.messages += moved
        after.errors -= moved
    result = StepRepair(
        row.session,
        row.turn,
        row.step,
        True,
        _kind(row.outcome_kind),
        row.chunk_count,
        record.outcome_kind,
        count,
        row.seq_start,
        later_steps if shift else 0,
    )
    return RepairPlan(new, shift, after, line, result, row.outcome)


def _kind(value: str) -> OutcomeKind:
    return "message" if value == "message" else "error"


class RepairSql(msgspec.Struct, frozen=True):
    """The statements of one repair in a backend's placeholder style (see the module)."""

    later_steps: str
    shift: str
    update_step: str
    session_counters: str
    step_line: str
    delete_line: str
    insert_log: str


_STEP_FIELDS = (
    "seq_end",
    "chunk_count",
    "provider",
    "model",
    "outcome_kind",
    "outcome",
    "packing",
    "chunks",
    "first_ns",
    "completed_ns",
    "committed_ns",
    "deployment",
    "routed",
)


def repair_sql(ph: str, *, json_cast: str = "", line_columns: tuple[str, ...]) -> RepairSql:
    """The statements with placeholder ``ph`` (``?`` or ``%s``); ``json_cast`` follows the
    outcome's placeholder (PostgreSQL's ``::json``)."""
    key = f"session = {ph} AND turn = {ph} AND step = {ph}"
    sets = ", ".join(f"{c} = {ph}{json_cast if c == 'outcome' else ''}" for c in _STEP_FIELDS)
    return RepairSql(
        later_steps=f"SELECT count(*) FROM steps WHERE session = {ph} AND position > {ph}",
        shift=(
            f"UPDATE steps SET seq_start = seq_start + {ph}, seq_end = seq_end + {ph}"
            f" WHERE session = {ph} AND position > {ph}"
        ),
        update_step=f"UPDATE steps SET {sets} WHERE {key}",
        session_counters=(
            f"UPDATE sessions SET last_seq = {ph}, chunks = {ph}, messages = {ph},"
            f" errors = {ph}, first_ns = (SELECT min(first_ns) FROM steps WHERE session = {ph}),"
            f" last_ns = (SELECT max(completed_ns) FROM steps WHERE session = {ph})"
            f" WHERE session = {ph}"
        ),
        step_line=f"SELECT {', '.join(line_columns)} FROM step_usage WHERE {key}",
        delete_line=f"DELETE FROM step_usage WHERE {key}",
        insert_log=(
            f"INSERT INTO step_repairs ({', '.join(REPAIR_COLUMNS)}) VALUES "
            f"({', '.join([ph] * len(REPAIR_COLUMNS))})"
        ),
    )


def step_values(row: StepRow) -> tuple[object, ...]:
    """The values of :attr:`RepairSql.update_step`: the rewritten fields, then the key."""
    return (*(getattr(row, f) for f in _STEP_FIELDS), row.session, row.turn, row.step)


def counter_values(state: SessionState) -> tuple[object, ...]:
    """The values of :attr:`RepairSql.session_counters`."""
    s = state.session
    return (state.last_seq, state.chunks, state.messages, state.errors, s, s, s)


def shift_steps(plan: RepairPlan) -> list[tuple[object, ...]]:
    """The two executions of :attr:`RepairSql.shift` that move the later steps by
    ``plan.shift`` (none when it is 0): up past every seq, then down to their place."""
    if not plan.shift:
        return []
    where = (plan.row.session, plan.row.position)
    down = plan.shift - SHIFT_OFFSET
    return [(SHIFT_OFFSET, SHIFT_OFFSET, *where), (down, down, *where)]
