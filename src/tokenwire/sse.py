"""Server-sent events: an incremental byte-level parser (owned by the adapters work).

``SseParser.feed(data)`` accepts any split of the bytes on the network (inside a UTF-8
character, inside ``\\r\\n``, inside ``data:``) and returns the events completed so far.
"""

from __future__ import annotations

import msgspec


class SseEvent(msgspec.Struct, frozen=True):
    """One dispatched server-sent event. ``event`` is ``"message"`` when the stream named none."""

    data: str
    event: str = "message"
    id: str | None = None
