"""Replay, live tail, verification and the session events feed, from the broker's retained stream.

- :func:`read_session` yields one :class:`ReplayEvent` per retained chunk of a session, its
  stream seq being the resume id, rendered as the user saw it (:mod:`._render`); with a
  store, the steps the broker no longer retains come first from its chunk log (``_history``);
  :func:`paced` gives them their original timing, scaled.
- :func:`verify` folds the retained chunks with the one fold and compares them, step by step,
  with the store (:class:`Difference`).
- :func:`events_router` is the HTTP side a gateway mounts: the session events as SSE with a
  slow-reader policy that never blocks the broker read, the sessions and messages from the
  store, and the viewer page.
- :class:`EventPrinter` writes events to a terminal (``tokenwire replay`` / ``tail``).

See docs/replay.md. Errors::

    ReplayError
    ├── InvalidSessionId
    ├── SessionNotFound
    ├── ReplayStalled
    └── UndecodableChunk
"""

from __future__ import annotations

from tokenwire.broker import RawChunk
from tokenwire.replay._errors import (
    InvalidSessionId,
    ReplayError,
    ReplayStalled,
    SessionNotFound,
    UndecodableChunk,
)
from tokenwire.replay._events import (
    ReplayEvent,
    Shown,
    ShownError,
    ShownFinish,
    ShownReasoning,
    ShownStepStart,
    ShownText,
    ShownToolCall,
)
from tokenwire.replay._http import DEFAULT_MAX_READERS, StoreProvider, events_router, viewer_html
from tokenwire.replay._parents import stored_parents, with_parent
from tokenwire.replay._print import EventPrinter, attempt_line
from tokenwire.replay._read import paced, read_session
from tokenwire.replay._render import SessionRenderer
from tokenwire.replay._source import stored_chunks
from tokenwire.replay._sse import ClientQueue, NcProvider, SlowReaderPolicy, SseStats, coalesce
from tokenwire.replay._verify import (
    Difference,
    DifferenceKind,
    RetainedSteps,
    VerifyReport,
    compare_with_store,
    verify,
    verify_report,
)

__all__ = [
    "DEFAULT_MAX_READERS",
    "ClientQueue",
    "Difference",
    "DifferenceKind",
    "EventPrinter",
    "InvalidSessionId",
    "NcProvider",
    "RawChunk",
    "ReplayError",
    "ReplayEvent",
    "ReplayStalled",
    "RetainedSteps",
    "SessionNotFound",
    "SessionRenderer",
    "Shown",
    "ShownError",
    "ShownFinish",
    "ShownReasoning",
    "ShownStepStart",
    "ShownText",
    "ShownToolCall",
    "SlowReaderPolicy",
    "SseStats",
    "StoreProvider",
    "UndecodableChunk",
    "VerifyReport",
    "attempt_line",
    "coalesce",
    "compare_with_store",
    "events_router",
    "paced",
    "read_session",
    "stored_chunks",
    "stored_parents",
    "verify",
    "verify_report",
    "viewer_html",
    "with_parent",
]
