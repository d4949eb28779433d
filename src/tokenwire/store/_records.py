"""What goes into the store and what comes back from it (besides the session events)."""

from __future__ import annotations

from typing import Literal

import msgspec

from tokenwire.ledger import StepUsage
from tokenwire.schemas import ChunkEnvelope, Message, RecordedError

OutcomeKind = Literal["message", "error"]
"""How a step ended: an assembled :class:`Message` or a :class:`RecordedError`."""


class StepRecord(msgspec.Struct, frozen=True):
    """One closed step, as the assembler hands it to :meth:`Store.commit`.

    ``chunks`` are the step's envelopes in ordinal order (possibly empty, possibly with a gap
    when ``outcome`` is a ``gap`` error); every envelope belongs to this (session, turn, step).
    ``completed_ns`` is when the assembler closed the step (Unix ns).
    """

    session: str
    turn: int
    step: int
    provider: str
    model: str
    chunks: list[ChunkEnvelope]
    outcome: Message | RecordedError
    completed_ns: int

    @property
    def outcome_kind(self) -> OutcomeKind:
        """``"message"`` or ``"error"``."""
        return "message" if isinstance(self.outcome, Message) else "error"


class CommittedStep(msgspec.Struct, frozen=True):
    """Where a committed step sits in its session: chunks ``seq_start..seq_end``.

    A step without chunks has ``seq_end == seq_start - 1``. ``inserted`` is False when the
    step was already stored (an idempotent replay); the range and kind are then the stored ones.
    ``usage`` is the ledger line this commit wrote with the step (``None`` when it wrote
    none: the step was already stored).
    """

    session: str
    turn: int
    step: int
    seq_start: int
    seq_end: int
    outcome_kind: OutcomeKind
    inserted: bool
    usage: StepUsage | None = None


class SessionSummary(msgspec.Struct, frozen=True):
    """One session's counters. ``first_ns`` is its earliest chunk time (or step completion
    when it has no chunk), ``last_ns`` its latest step completion (Unix ns). ``tenant``: the
    tenant of the first step stored for it (the gateway key's, on its first chunk), None when
    that step had none; it never changes after."""

    session: str
    steps: int
    messages: int
    errors: int
    chunks: int
    last_seq: int
    first_ns: int
    last_ns: int
    tenant: str | None = None


class StoreStats(msgspec.Struct, frozen=True):
    """Counts over the whole store."""

    sessions: int
    steps: int
    messages: int
    errors: int
    chunks: int


class StepRepair(msgspec.Struct, frozen=True):
    """What :meth:`Store.replace_step` did to one stored step.

    ``before_*`` is what the store held, ``after_*`` what it holds now (the same when
    ``replaced`` is False: the row already held the record). ``moved_steps`` later steps of
    the session moved by ``after_chunks - before_chunks`` seqs, so the session's seqs stay
    contiguous; their positions and contents are unchanged.
    """

    session: str
    turn: int
    step: int
    replaced: bool
    before_kind: OutcomeKind
    before_chunks: int
    after_kind: OutcomeKind
    after_chunks: int
    seq_start: int
    moved_steps: int = 0
