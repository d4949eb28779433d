"""The fold's verdict on a streaming step, at the gateway: one truth for caller and store.

The assembler records what :class:`~tokenwire.fold.StepFold` makes of the step's chunks. A
streaming caller gets the chunks as they come, so without this a stream the fold calls broken
(a tool call that never got a name, a block-end of the wrong kind) would end with ``[DONE]``
for the caller and as a ``contract`` error in the store. The gateway folds the chunks it
publishes by the same rules and ends such a step as the store will record it, holding the
step's content until its end as the assembler does (bounded by ``max_step_bytes``).
docs/gateway.md, "Publishing semantics".
"""

from __future__ import annotations

from tokenwire.fold import FoldLimits, StepFold
from tokenwire.schemas import Finish, Message, RecordedError, StreamChunk


class ContractCheck:
    """Feed every published chunk; :meth:`feed` says when the step just broke a rule.

    ``limits`` are the step's own bounds, which the gateway's meter enforces before the fold
    would, so what this reports is a contract failure, never a limit.
    """

    __slots__ = ("_fold", "_reported")

    def __init__(self, limits: FoldLimits) -> None:
        self._fold = StepFold(limits)
        self._reported = False

    def feed(self, chunk: StreamChunk) -> str | None:
        """The fold's message when this chunk made the step fail (before or at its finish),
        once; None while the step is well formed."""
        fold = self._fold
        fold.feed(chunk)
        if self._reported or (fold.failure is None and type(chunk) is not Finish):
            return None  # the usual chunk: a delta of a well-formed step
        broken = self._broken(chunk)
        self._reported = broken is not None
        return broken

    def result(self) -> Message | RecordedError:
        """The fold's message or recorded error of the step so far (after its finish: its
        outcome)."""
        return self._fold.result()

    def _broken(self, chunk: StreamChunk) -> str | None:
        failure = self._fold.failure
        if failure is not None:
            return failure[1]
        if isinstance(chunk, Finish) and chunk.error is None and chunk.reason != "aborted":
            result = self._fold.result()
            if isinstance(result, RecordedError):
                return result.message
        return None
