"""Replay events: one per retained chunk, carrying what the user saw at that point.

Every chunk the broker retains for a session becomes exactly one :class:`ReplayEvent`. Its
position is the stream sequence of the message that carried it (``seq``) and its ``index`` in
that message (0 for a version-1 message of one chunk; a frame carries several, ADR 0024);
``last`` marks the message's last chunk. The event's id (:attr:`ReplayEvent.event_id`) is
``seq`` for a message's last chunk and ``seq:index`` inside a frame: resuming after it
misses and repeats nothing. ``shown`` is the chunk rendered the way the caller of
the gateway saw it: text and reasoning as they streamed, a tool call only once complete,
the step's end as its finish or its recorded error. A chunk that arrived ahead of a missing
ordinal shows nothing until the chunk that unblocks it arrives; that later event then shows
both.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from tokenwire.schemas import ChunkEnvelope, FinishReason, RecordedError, TokenUsage, ToolCallBlock


class ShownStepStart(msgspec.Struct, tag="step-start", tag_field="type", frozen=True):
    """The step's first chunk (ordinal 0). ``time_to_first_chunk_s`` is measured from the
    gateway receiving the request, when the envelope recorded that time."""

    time_to_first_chunk_s: float | None = None


class ShownText(msgspec.Struct, tag="text", tag_field="type", frozen=True):
    """Visible text of block ``index``, as it streamed."""

    index: int
    text: str


class ShownReasoning(msgspec.Struct, tag="reasoning", tag_field="type", frozen=True):
    """Reasoning text of block ``index``, as it streamed."""

    index: int
    text: str


class ShownToolCall(msgspec.Struct, tag="tool-call", tag_field="type", frozen=True):
    """A complete tool call (its block ended, or the step finished with it)."""

    call: ToolCallBlock


class ShownFinish(msgspec.Struct, tag="finish", tag_field="type", frozen=True):
    """The step finished normally. ``dropped_tool_calls`` counts the calls a ``max-tokens``
    finish removed (a truncated call is never run)."""

    reason: FinishReason
    usage: TokenUsage | None = None
    dropped_tool_calls: int = 0


class ShownError(msgspec.Struct, tag="error", tag_field="type", frozen=True):
    """The step failed: ``finish {error|aborted}``, a contract break, or a gap."""

    error: RecordedError


Shown = ShownStepStart | ShownText | ShownReasoning | ShownToolCall | ShownFinish | ShownError
"""The closed union of what a replay event can show, tagged by ``type``."""


class ReplayEvent(msgspec.Struct, frozen=True):
    """One retained chunk: the stream ``seq`` of its message, its envelope, what it showed,
    its ``index`` in the message and whether it is the message's ``last`` chunk.

    ``coalesced`` is only set on the SSE endpoint's slow-reader path: this event stands for
    itself and the ``coalesced`` events before it, whose text it carries (see docs/replay.md).

    ``source`` is ``"store"`` for a chunk of a step the broker no longer retains, read from
    the store's chunk log: its ``seq`` is 0 and its ``index`` the store's per-session seq
    (``_history.py``).
    """

    seq: int
    envelope: ChunkEnvelope
    shown: tuple[Shown, ...] = ()
    coalesced: int = 0
    index: int = 0
    last: bool = True
    source: Literal["broker", "store"] = "broker"

    @property
    def event_id(self) -> str:
        """The resume id: ``"<seq>"`` after a message's last chunk, ``"<seq>:<index>"``
        inside a frame (see :func:`tokenwire.replay.position_after`)."""
        return str(self.seq) if self.last else f"{self.seq}:{self.index}"

    @property
    def next_position(self) -> tuple[int, int]:
        """Where a read continues after this event: ``(seq, index)`` of the next chunk."""
        return (self.seq + 1, 0) if self.last else (self.seq, self.index + 1)

    @property
    def step_key(self) -> tuple[int, int]:
        """``(turn, step)`` of the chunk."""
        return self.envelope.turn, self.envelope.step
