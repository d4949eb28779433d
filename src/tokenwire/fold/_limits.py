"""The bounds of one step's fold."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FoldLimits:
    """Bounds that keep one step's memory finite whatever an adapter sends.

    - ``max_open_blocks``: blocks open at once (started or receiving deltas, not yet ended).
    - ``max_blocks``: blocks in the step, open and ended together.
    - ``max_step_bytes``: UTF-8 bytes of text, reasoning, tool-call arguments and ended blocks.
    - ``reorder_window``: how far ahead of the next expected ordinal a ``StepCollector``
      buffers a chunk (so at most ``reorder_window - 1`` chunks wait in its buffer).

    Exceeding one of the first three ends the step as ``RecordedError(kind="limit")``; the
    fourth raises ``ReorderWindowError`` for the chunk that would exceed it.
    """

    max_open_blocks: int = 64
    max_blocks: int = 256
    max_step_bytes: int = 16 * 1024 * 1024
    reorder_window: int = 4096

    def __post_init__(self) -> None:
        for name in ("max_open_blocks", "max_blocks", "max_step_bytes", "reorder_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"FoldLimits.{name} must be at least 1")


DEFAULT_LIMITS = FoldLimits()
"""The limits used when none are given."""
