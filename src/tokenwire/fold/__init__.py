"""The one fold: a step's stream chunks in, its assembled message or recorded error out.

Every component that turns chunks back into a message (assembler, ``replay --verify``, the
gateway's non-streaming responses, ``tokenwire fold``) uses this package and nothing else.

- :class:`StepFold` folds one step's chunks fed in ordinal order.
- :class:`StepCollector` accepts chunks in any delivery order, dedupes and reorders them by
  ordinal within a bounded window, reports gaps, and feeds a :class:`StepFold`.
- :func:`fold` folds a whole iterable of chunks at once.
- :class:`FoldLimits` bounds one step's memory.

The rules and bounds are in docs/fold.md.
"""

from __future__ import annotations

from tokenwire.fold._collector import Added, StepCollector
from tokenwire.fold._errors import (
    ChunkAfterFinish,
    ContractViolation,
    FoldError,
    InvalidOrdinal,
    ReorderWindowError,
    StepStateError,
)
from tokenwire.fold._limits import DEFAULT_LIMITS, FoldLimits
from tokenwire.fold._step import StepFold, fold

__all__ = [
    "DEFAULT_LIMITS",
    "Added",
    "ChunkAfterFinish",
    "ContractViolation",
    "FoldError",
    "FoldLimits",
    "InvalidOrdinal",
    "ReorderWindowError",
    "StepCollector",
    "StepFold",
    "StepStateError",
    "fold",
]
