"""StepCollector: one step's chunks in any delivery order, folded in ordinal order."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Literal

from tokenwire.fold._errors import InvalidOrdinal, ReorderWindowError, StepStateError
from tokenwire.fold._limits import DEFAULT_LIMITS, FoldLimits
from tokenwire.fold._step import StepFold
from tokenwire.schemas import Finish, Message, RecordedError, StreamChunk


class Added(enum.Enum):
    """What :meth:`StepCollector.add` did with a chunk."""

    ACCEPTED = "accepted"
    """Fed to the fold now, with any buffered successors it unblocked."""
    BUFFERED = "buffered"
    """Kept until the ordinals below it arrive."""
    DUPLICATE = "duplicate"
    """This ordinal was added before; the chunk was dropped (the first copy wins)."""
    BEYOND_FINISH = "beyond-finish"
    """The ordinal comes after the step's finish (a contract break); the chunk was dropped."""
    CLOSED = "closed"
    """The step was already ended with :meth:`StepCollector.fail`; the chunk was dropped."""


class StepCollector:
    """Reassemble one step from chunks delivered in any order, by their ordinal (from 0).

    Chunks are fed to a :class:`StepFold` in ordinal order; later ones wait in a buffer
    bounded by ``limits.reorder_window`` (an ordinal that far ahead of the next expected one
    raises :class:`ReorderWindowError` and is not kept). Duplicates are dropped by
    ordinal. The step is :attr:`complete` once its finish was fed, which implies every
    ordinal below it was; :meth:`missing` names the gaps meanwhile. ``keep_text`` is the
    fold's (:class:`StepFold`).

    >>> from tokenwire.schemas import TextDelta
    >>> c = StepCollector()
    >>> c.add(1, Finish(reason="stop"))
    <Added.BUFFERED: 'buffered'>
    >>> c.missing()
    [0]
    >>> c.add(0, TextDelta(index=0, text="hi"))
    <Added.ACCEPTED: 'accepted'>
    >>> c.complete, c.result().text
    (True, 'hi')
    """

    __slots__ = (
        "_beyond_finish",
        "_failed",
        "_finish_at",
        "_fold",
        "_highest",
        "_next",
        "_pending",
        "_window",
    )

    def __init__(self, limits: FoldLimits = DEFAULT_LIMITS, *, keep_text: bool = True) -> None:
        self._fold = StepFold(limits, keep_text=keep_text)
        self._window = limits.reorder_window
        self._next = 0
        self._pending: dict[int, StreamChunk] = {}
        self._highest = -1
        self._finish_at: int | None = None
        self._failed = False
        self._beyond_finish = 0

    def add(self, ordinal: int, chunk: StreamChunk) -> Added:
        """Take the chunk at ``ordinal``; see :class:`Added` for the outcomes."""
        if ordinal == self._next and not self._failed and self._finish_at is None:
            return self._accept(ordinal, chunk)  # the common case: in order
        if ordinal < 0:
            raise InvalidOrdinal(ordinal)
        if ordinal < self._next or ordinal in self._pending:
            return Added.DUPLICATE
        if self._failed:
            return Added.CLOSED
        if self._finish_at is not None and ordinal > self._finish_at:
            self._beyond_finish += 1
            return Added.BEYOND_FINISH
        if ordinal >= self._next + self._window:
            raise ReorderWindowError(ordinal, self._next, self._window)
        if ordinal != self._next:
            return self._buffer(ordinal, chunk)
        return self._accept(ordinal, chunk)

    def add_run(self, first: int, chunks: Sequence[StreamChunk]) -> bool:
        """Take ``chunks`` at the ordinals ``first``, ``first + 1``, ... when they continue the
        step in order: ``first`` is the next ordinal, nothing waits in the buffer, no finish was
        seen, and none of the run but its last chunk is a finish. That is :meth:`add` of each,
        every one ``ACCEPTED``, in one call (a frame's chunks). False, and nothing taken,
        otherwise: add them one by one."""
        if first != self._next or self._failed or self._finish_at is not None or self._pending:
            return False
        last = len(chunks) - 1
        if Finish in map(type, chunks[:last]):
            return False
        if type(chunks[last]) is Finish:
            self._note_finish(first + last)  # as _accept notes it: before the fold sees it
        feed = self._fold.feed
        for chunk in chunks:
            feed(chunk)
        self._next = first + last + 1
        return True

    @property
    def fold(self) -> StepFold:
        """The step's fold (for :meth:`StepFold.snapshot` and :attr:`StepFold.ignored_deltas`)."""
        return self._fold

    @property
    def next_ordinal(self) -> int:
        """The ordinal the fold needs next."""
        return self._next

    @property
    def buffered(self) -> int:
        """How many chunks wait for a lower ordinal."""
        return len(self._pending)

    @property
    def beyond_finish(self) -> int:
        """How many chunks were dropped because their ordinal came after the finish."""
        return self._beyond_finish

    @property
    def complete(self) -> bool:
        """Whether the finish was fed (so no ordinal below it is missing)."""
        return self._finish_at is not None and self._next > self._finish_at

    def missing(self) -> list[int]:
        """Ordinals not yet seen below the finish (when seen) or the highest ordinal seen.

        At most ``reorder_window`` long.
        """
        upper = self._finish_at if self._finish_at is not None else self._highest
        if self._failed or upper < self._next:
            return []
        return [o for o in range(self._next, upper) if o not in self._pending]

    def result(self) -> Message | RecordedError:
        """The step's outcome once complete (or failed); StepStateError before."""
        return self._fold.result()

    def fail(self, kind: Literal["gap", "abandoned"], message: str) -> RecordedError:
        """End the step without its finish; drop the buffered chunks (see StepFold.fail)."""
        if self._fold.finished:
            raise StepStateError("the step already ended")
        self._failed = True
        self._pending.clear()
        return self._fold.fail(kind, message)

    def _accept(self, ordinal: int, chunk: StreamChunk) -> Added:
        if type(chunk) is Finish:
            self._note_finish(ordinal)
        self._fold.feed(chunk)
        self._next = ordinal + 1
        pending = self._pending
        while pending and self._next in pending:
            self._fold.feed(pending.pop(self._next))
            self._next += 1
        return Added.ACCEPTED

    def _buffer(self, ordinal: int, chunk: StreamChunk) -> Added:
        if type(chunk) is Finish:
            self._note_finish(ordinal)
        self._pending[ordinal] = chunk
        self._highest = max(self._highest, ordinal)
        return Added.BUFFERED

    def _note_finish(self, ordinal: int) -> None:
        """Remember the earliest finish; chunks buffered after it can never be fed."""
        if self._finish_at is not None and self._finish_at <= ordinal:
            return
        self._finish_at = ordinal
        for late in [o for o in self._pending if o > ordinal]:
            del self._pending[late]
            self._beyond_finish += 1
        self._highest = min(self._highest, ordinal)
