"""The replay package's exceptions, drawn once.

::

    ReplayError
    ├── InvalidSessionId(session)          not letters, digits, ``-``, ``_`` (1..128)
    ├── SessionNotFound(session, stream)   the broker retains no chunk of the session
    ├── ReplayStalled(session, waited_s, last_seq)
    │                                      a replay knew more chunks were due, none came
    └── UndecodableChunk(seq, reason)      a retained payload is not a chunk envelope

Broker failures (``BrokerUnavailable``) and store failures (``StoreError``) pass through
unchanged: they already name their URL and cause.
"""

from __future__ import annotations


class ReplayError(Exception):
    """Base of every error raised by :mod:`tokenwire.replay`."""


class InvalidSessionId(ReplayError):  # noqa: N818 - reads as the condition it reports
    """``session`` is not a valid session id (letters, digits, ``-``, ``_``; 1 to 128)."""

    def __init__(self, session: str) -> None:
        self.session = session
        super().__init__(
            f"invalid session id {session[:140]!r}: use letters, digits, '-', '_' (1 to 128)"
        )


class SessionNotFound(ReplayError):  # noqa: N818 - reads as the condition it reports
    """The stream ``stream`` retains no chunk of ``session`` (never existed, or aged out)."""

    def __init__(self, session: str, stream: str) -> None:
        self.session = session
        self.stream = stream
        super().__init__(f"session {session!r} not found on the broker (stream {stream})")


class ReplayStalled(ReplayError):  # noqa: N818 - reads as the condition it reports
    """A replay expected more chunks of ``session`` after ``last_seq`` but none came for
    ``waited_s`` seconds (the server is overloaded or the consumer was lost)."""

    def __init__(self, session: str, waited_s: float, last_seq: int) -> None:
        self.session = session
        self.waited_s = waited_s
        self.last_seq = last_seq
        super().__init__(
            f"replay of {session} stalled after stream seq {last_seq} ({waited_s:.1f} s idle)"
        )


class UndecodableChunk(ReplayError):  # noqa: N818 - reads as the condition it reports
    """The payload at stream sequence ``seq`` is not a chunk envelope (``reason`` says why).

    Nothing after it was read; reading again from ``seq + 1`` skips it.
    """

    def __init__(self, seq: int, reason: str) -> None:
        self.seq = seq
        self.reason = reason
        super().__init__(f"stream seq {seq} is not a chunk envelope: {reason}")
