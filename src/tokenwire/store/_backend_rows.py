"""The stored shapes shared by every backend: a packed step row and a session row.

Each backend reads rows as tuples in the column order named here, so the SQL and the Python
agree in one place.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import assert_never

import msgspec

from tokenwire.schemas import (
    ChunkEvent,
    ErrorEvent,
    Message,
    MessageEvent,
    RecordedError,
    Routed,
    SessionEvent,
)
from tokenwire.store._errors import StoreIntegrityError
from tokenwire.store._packing import decode_outcome, unpack_chunks
from tokenwire.store._records import CommittedStep, OutcomeKind, SessionSummary

STEP_COLUMNS = (
    "session",
    "turn",
    "step",
    "position",
    "seq_start",
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


def step_select(**replace: str) -> str:
    """The select list of :data:`STEP_COLUMNS`, some replaced by expressions (for example
    ``chunks="X''"`` to skip the chunk log when only outcomes are read)."""
    return ", ".join(f"{replace[c]} AS {c}" if c in replace else c for c in STEP_COLUMNS)


SESSION_COLUMNS = (
    "session",
    "last_seq",
    "steps",
    "messages",
    "errors",
    "chunks",
    "first_ns",
    "last_ns",
    "tenant",
)
SEQ_MAX = 2**62
"""Stands for "no upper bound" in sequence range queries."""


class StepRow(msgspec.Struct, frozen=True, array_like=True):
    """One row of ``steps``: a whole step, its chunk log packed in ``chunks``.

    ``position`` numbers the session's steps from 1 in commit order; it orders steps (two
    steps without chunks share a ``seq_start``) and is unique per session. ``deployment`` and
    ``routed`` (JSON): a routed step's deployment and its first chunk's ``routed``.
    """

    session: str
    turn: int
    step: int
    position: int
    seq_start: int
    seq_end: int
    chunk_count: int
    provider: str
    model: str
    outcome_kind: str
    outcome: str
    packing: int
    chunks: bytes
    first_ns: int
    completed_ns: int
    committed_ns: int
    deployment: str | None = None
    routed: str | None = None

    def values(self) -> tuple[object, ...]:
        """The column values in :data:`STEP_COLUMNS` order."""
        return msgspec.structs.astuple(self)

    def committed(self, inserted: bool) -> CommittedStep:
        """The commit result citing this row."""
        kind: OutcomeKind = "message" if self.outcome_kind == "message" else "error"
        return CommittedStep(
            self.session, self.turn, self.step, self.seq_start, self.seq_end, kind, inserted
        )


class SessionState(msgspec.Struct, array_like=True):
    """One row of ``sessions``: the last seq handed out and the session's counters.

    Mutable on purpose: the commit planner advances a copy inside the transaction.
    """

    session: str
    last_seq: int = 0
    steps: int = 0
    messages: int = 0
    errors: int = 0
    chunks: int = 0
    first_ns: int | None = None
    last_ns: int | None = None
    tenant: str | None = None

    def values(self) -> tuple[object, ...]:
        """The column values in :data:`SESSION_COLUMNS` order."""
        return msgspec.structs.astuple(self)

    def summary(self) -> SessionSummary:
        """The public view of this row."""
        return SessionSummary(
            session=self.session,
            steps=self.steps,
            messages=self.messages,
            errors=self.errors,
            chunks=self.chunks,
            last_seq=self.last_seq,
            first_ns=self.first_ns or 0,
            last_ns=self.last_ns or 0,
            tenant=self.tenant,
        )


def step_row(values: tuple[object, ...] | list[object]) -> StepRow:
    """A StepRow from a database row selected in :data:`STEP_COLUMNS` order."""
    return msgspec.convert(values, StepRow)


def session_state(values: tuple[object, ...] | list[object]) -> SessionState:
    """A SessionState from a database row selected in :data:`SESSION_COLUMNS` order."""
    return msgspec.convert(values, SessionState)


def outcome_anchor(row: StepRow) -> int:
    """The seq an outcome event belongs to in range queries.

    The last chunk of its step; for a step without chunks, the seq its first chunk would have
    had. So adjacent ranges ``[a, b]`` and ``[b + 1, c]`` split the events with no overlap.
    """
    return max(row.seq_start, row.seq_end)


def outcome_event(row: StepRow) -> MessageEvent | ErrorEvent:
    """The MessageEvent or ErrorEvent of a row, citing its chunk range."""
    outcome = decode_outcome(row.outcome_kind, row.outcome)
    cite = (row.session, row.turn, row.step, row.seq_start, row.seq_end, row.provider, row.model)
    routed = _routed(row.routed) if row.routed else msgspec.UNSET
    match outcome:
        case Message():
            return MessageEvent(*cite, message=outcome, routed=routed)
        case RecordedError():
            return ErrorEvent(*cite, error=outcome, routed=routed)
        case _:
            assert_never(outcome)


_routed_decoder = msgspec.json.Decoder(Routed)


def _routed(text: str) -> Routed:
    """Decode a ``routed`` column (JSON, editable with plain SQL); damage is a
    StoreIntegrityError, like a damaged outcome's."""
    try:
        return _routed_decoder.decode(text)
    except msgspec.DecodeError as exc:
        raise StoreIntegrityError(f"damaged routed: {exc}") from exc


def row_events(row: StepRow, from_seq: int, to_seq: int) -> Iterator[SessionEvent]:
    """The row's chunk events with seq in ``[from_seq, to_seq]``, then its outcome event
    when its anchor is in the range."""
    if row.chunk_count and row.seq_end >= from_seq and row.seq_start <= to_seq:
        for offset, envelope in enumerate(unpack_chunks(row.chunks, row.packing)):
            if from_seq <= row.seq_start + offset <= to_seq:
                yield ChunkEvent(seq=row.seq_start + offset, envelope=envelope)
    if from_seq <= outcome_anchor(row) <= to_seq:
        yield outcome_event(row)


def rows_events(rows: list[StepRow], from_seq: int, to_seq: int | None) -> list[SessionEvent]:
    """The events of rows (in position order) within ``[from_seq, to_seq]``, in seq order."""
    upper = SEQ_MAX if to_seq is None else to_seq
    return [event for row in rows for event in row_events(row, from_seq, upper)]
