"""The fold's exception tree.

::

    FoldError
    ├── ContractViolation          the chunks broke the adapter contract in a way no result absorbs
    │   ├── ChunkAfterFinish       a chunk arrived after the step ended
    │   └── InvalidOrdinal         an ordinal below 0
    ├── ReorderWindowError      StepCollector: an ordinal too far ahead of the next expected one
    └── StepStateError             API misuse: result() before the step ended, fail() after it

Contract breaks *inside* a step (a text delta for a tool-call block, two tool calls spliced
into one index) are not raised: they end the step as ``RecordedError(kind="contract")``.
Only what cannot be recorded as the step's outcome (the step already has one) is raised.
"""

from __future__ import annotations


class FoldError(Exception):
    """Base of every error the fold raises."""


class ContractViolation(FoldError):  # noqa: N818 (the name the design documents use)
    """The chunks broke the adapter contract and the step's outcome cannot record it."""


class ChunkAfterFinish(ContractViolation):
    """A chunk arrived after the step ended (by ``finish`` or by ``fail``).

    ``chunk_type`` is the chunk's tag (``"text-delta"``...), ``ended_by`` what ended the step
    (``"finish"``, ``"gap"``, ``"abandoned"``). The step's result is unchanged.
    """

    def __init__(self, chunk_type: str, ended_by: str) -> None:
        super().__init__(f"{chunk_type} chunk after the step ended ({ended_by})")
        self.chunk_type = chunk_type
        self.ended_by = ended_by


class InvalidOrdinal(ContractViolation):
    """A chunk ordinal below 0 (ordinals number a step's chunks from 0)."""

    def __init__(self, ordinal: int) -> None:
        super().__init__(f"chunk ordinal {ordinal} is negative")
        self.ordinal = ordinal


class ReorderWindowError(FoldError):
    """An ordinal is ``window`` or more ahead of the next expected one; the chunk was not kept.

    Buffering it would let one lost chunk grow memory without bound. The collector is
    unchanged; the caller usually waits for the missing ordinals or ends the step with
    ``fail("gap", ...)``.
    """

    def __init__(self, ordinal: int, next_ordinal: int, window: int) -> None:
        super().__init__(
            f"chunk ordinal {ordinal} is too far ahead: next expected {next_ordinal}, "
            f"reorder window {window}"
        )
        self.ordinal = ordinal
        self.next_ordinal = next_ordinal
        self.window = window


class StepStateError(FoldError):
    """The fold was used out of order: ``result()`` before the step ended, ``fail()`` after."""
