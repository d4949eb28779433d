"""The assembler's exception tree.

::

    AssemblerError
    ├── AssemblyFullError(open_steps, limit)   feed() would open a step beyond max_open_steps
    ├── AssemblerStartError(what, reason) the service could not start (broker, store, metrics)
    ├── AssemblerLoopError(loop, reason)  a background loop ended while the instance ran
    └── ReadBackError(reason)              a read-back from the stream did not complete

Store and broker errors are not re-wrapped while running: ``StoreUnavailable`` is retried
with back-off (docs/assembler.md), everything else that is permanent for one step sends that
step's chunks to the dead-letter subject.
"""

from __future__ import annotations


class AssemblerError(Exception):
    """Base of every error the assembler raises."""


class AssemblyFullError(AssemblerError):
    """A chunk would open step ``open_steps + 1`` while ``limit`` steps are open.

    The caller checks :meth:`Assembly.has_room` first and applies back-pressure (stops
    taking messages) instead; this error means it did not.
    """

    def __init__(self, open_steps: int, limit: int) -> None:
        super().__init__(f"{open_steps} steps open, limit {limit}: cannot open another")
        self.open_steps = open_steps
        self.limit = limit


class AssemblerStartError(AssemblerError):
    """The service could not start: ``what`` (broker, store, metrics) failed for ``reason``."""

    def __init__(self, what: str, reason: str) -> None:
        super().__init__(f"assembler cannot start: {what}: {reason}")
        self.what = what
        self.reason = reason


class AssemblerLoopError(AssemblerError):
    """A background loop (``loop``: the commit, expiry, lag, balance or heartbeat loop) ended
    while the instance ran, for ``reason``. The instance stops, with this error, instead of
    running on without it (a commit loop gone meant nothing stored while /readyz said 200)."""

    def __init__(self, loop: str, reason: str) -> None:
        super().__init__(f"the assembler's {loop} loop ended: {reason}; the instance stops")
        self.loop = loop
        self.reason = reason


class ReadBackError(AssemblerError):
    """A read-back of a partition from the stream did not complete: the consumer's info went
    unanswered, the ordered read failed, no message came for its idle bound before the last
    one asked for, or the read ended before the message that revealed the loss (its replica
    still catching up). Retried (bounded); see ``Assembler._take_over``."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"read-back incomplete: {reason}")
        self.reason = reason
