"""The commit planner: which records to write and which seq range each one gets.

Pure and shared by every backend. A backend prices the records' ledger lines
(:func:`~tokenwire.store._usage_rows.usage_lines`, before its transaction: pricing takes
time), opens its transaction, locks and loads the session rows and the already stored ranges
of the batch's steps, calls :func:`plan_commit`, writes ``plan.rows``, ``plan.sessions`` and
``plan.lines`` (with their rollup deltas), and commits. Doing the idempotency check inside
the transaction, after the session rows are locked, is what makes it exact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec

from tokenwire.ledger import StepUsage
from tokenwire.schemas import Routed
from tokenwire.store._backend_rows import SessionState, StepRow
from tokenwire.store._errors import StoreIntegrityError
from tokenwire.store._packing import PACKING_ZLIB_JSON, encode_outcome, pack_chunks
from tokenwire.store._records import CommittedStep, StepRecord

StepKey = tuple[str, int, int]
"""(session, turn, step): the identity of one model call."""


class CommitPlan(msgspec.Struct, frozen=True):
    """What one commit writes: new ``rows``, updated ``sessions``, the ledger ``lines`` of
    the new rows, and the ``results`` to return (one per record, in record order)."""

    rows: list[StepRow]
    sessions: list[SessionState]
    results: list[CommittedStep]
    lines: list[StepUsage] = msgspec.field(default_factory=list)


def step_key(record: StepRecord) -> StepKey:
    """The (session, turn, step) of a record."""
    return (record.session, record.turn, record.step)


def validate(record: StepRecord) -> None:
    """Reject a record whose chunks belong to another step or are not in ordinal order."""
    where = step_key(record)
    previous = -1
    for envelope in record.chunks:
        if (envelope.session, envelope.turn, envelope.step) != where:
            raise StoreIntegrityError("a chunk of another step", *where)
        if envelope.ordinal <= previous:
            raise StoreIntegrityError("chunks not in increasing ordinal order", *where)
        previous = envelope.ordinal


def plan_commit(
    records: Sequence[StepRecord],
    stored: Mapping[StepKey, CommittedStep],
    sessions: Mapping[str, SessionState],
    committed_ns: int,
    lines: Sequence[StepUsage],
) -> CommitPlan:
    """Assign seq ranges in batch order; a step already in ``stored`` (or earlier in the
    batch) is not written again and returns its range with ``inserted=False``.

    ``sessions`` must hold the current row of every session in the batch (a fresh
    ``SessionState`` for a new one); it is not modified. ``lines`` are the records' ledger
    lines, in record order: a new row's line is written with it, exactly once, since a step
    row is.
    """
    states = {name: msgspec.structs.replace(state) for name, state in sessions.items()}
    known = dict(stored)
    plan = CommitPlan(rows=[], sessions=[], results=[])
    touched: dict[str, SessionState] = {}
    for record, line in zip(records, lines, strict=True):
        key = step_key(record)
        if (prior := known.get(key)) is not None:
            plan.results.append(msgspec.structs.replace(prior, inserted=False, usage=None))
            continue
        row = _new_row(record, states[record.session], committed_ns)
        plan.rows.append(row)
        plan.lines.append(line)
        plan.results.append(msgspec.structs.replace(row.committed(inserted=True), usage=line))
        known[key] = plan.results[-1]
        touched[record.session] = states[record.session]
    plan.sessions.extend(touched.values())
    return plan


def _new_row(record: StepRecord, state: SessionState, committed_ns: int) -> StepRow:
    """The row of a new step, advancing the session's state past it (a new session takes the
    step's tenant)."""
    count = len(record.chunks)
    if state.steps == 0:
        state.tenant = step_tenant(record)
    first_ns = record.chunks[0].time_ns if record.chunks else record.completed_ns
    row = StepRow(
        session=record.session,
        turn=record.turn,
        step=record.step,
        position=state.steps + 1,
        seq_start=state.last_seq + 1,
        seq_end=state.last_seq + count,
        chunk_count=count,
        provider=record.provider,
        model=record.model,
        outcome_kind=record.outcome_kind,
        outcome=encode_outcome(record.outcome),
        packing=PACKING_ZLIB_JSON,
        chunks=pack_chunks(record.chunks),
        first_ns=first_ns,
        completed_ns=record.completed_ns,
        committed_ns=committed_ns,
    )
    if (routed := step_routed(record)) is not None:
        row = msgspec.structs.replace(
            row, deployment=routed.deployment, routed=msgspec.json.encode(routed).decode()
        )
    _advance(state, row)
    return row


def step_routed(record: StepRecord) -> Routed | None:
    """A routed step's route, deployment and failed attempts, off its first chunk (ordinal 0),
    None when it has none."""
    if not record.chunks or record.chunks[0].ordinal != 0:
        return None
    routed = record.chunks[0].routed
    return routed if isinstance(routed, Routed) else None


def step_tenant(record: StepRecord) -> str | None:
    """The tenant on the step's first chunk (ordinal 0), None when it has none."""
    if not record.chunks or record.chunks[0].ordinal != 0:
        return None
    tenant = record.chunks[0].tenant
    return tenant if isinstance(tenant, str) else None


def _advance(state: SessionState, row: StepRow) -> None:
    state.last_seq = row.seq_end
    state.steps += 1
    state.chunks += row.chunk_count
    if row.outcome_kind == "message":
        state.messages += 1
    else:
        state.errors += 1
    state.first_ns = row.first_ns if state.first_ns is None else min(state.first_ns, row.first_ns)
    state.last_ns = (
        row.completed_ns if state.last_ns is None else max(state.last_ns, row.completed_ns)
    )
