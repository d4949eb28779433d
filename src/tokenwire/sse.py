"""Server-sent events: an incremental byte-level parser (owned by the adapters work).

``SseParser.feed(data)`` accepts any split of the bytes on the network (inside a UTF-8
character, inside ``\\r\\n``, inside ``data:``) and returns the events completed so far,
following the WHATWG event-stream rules (LF, CR and CRLF line endings, comments, several
``data:`` lines joined, ``event:`` and ``id:``, a BOM at the start, an incomplete last event
discarded). Hand-written rather than httpx-sse because it is measurably faster on recorded
provider bodies: docs/providers.md, "Why a hand-written SSE parser".

Exception tree::

    SseError
    └── SseEventTooLargeError   one incomplete event outgrew the buffer bound

Example::

    parser = SseParser()
    events = parser.feed(b"event: ping\\ndata: {}\\n\\ndata: par")
    events += parser.feed(b"tial\\n\\n")
    # [SseEvent(data='{}', event='ping'), SseEvent(data='partial')]
"""

from __future__ import annotations

from typing import Final

import msgspec

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "SseError", "SseEvent", "SseEventTooLargeError", "SseParser"]

DEFAULT_MAX_EVENT_BYTES: Final = 16 * 1024 * 1024
_BOM: Final = b"\xef\xbb\xbf"


class SseEvent(msgspec.Struct, frozen=True):
    """One dispatched server-sent event. ``event`` is ``"message"`` when the stream named none."""

    data: str
    event: str = "message"
    id: str | None = None


class SseError(Exception):
    """Base of the errors raised by :class:`SseParser`."""


class SseEventTooLargeError(SseError):
    """One incomplete event buffered more than ``limit`` bytes without a blank line.

    The parser refuses to grow without bound on a peer that never ends an event; the caller
    should abort the response (the parser's state is not usable afterwards).
    """

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"server-sent event exceeds {limit} bytes (buffered {size})")
        self.size = size
        self.limit = limit


class SseParser:
    """Incremental parser of one ``text/event-stream`` body.

    Contract: the concatenation of everything passed to :meth:`feed` is parsed as one stream,
    whatever the split; the events come back in order, each exactly once. At most
    ``max_event_bytes`` bytes of one not-yet-terminated event are held; past that
    :class:`SseEventTooLargeError` is raised. ``id`` persists across events (the spec's "last event
    ID"): an event carries the most recent ``id:`` seen, until another one replaces it.
    """

    __slots__ = ("_buf", "_last_id", "_limit", "_pending_cr", "_scan_from", "_started")

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._limit = max_event_bytes
        self._buf = bytearray()  # LF-normalised bytes of the incomplete event
        self._scan_from = 0  # where in _buf the search for a blank line resumes
        self._pending_cr = False  # the last byte fed was CR: a leading LF next is its pair
        self._started = False  # the BOM check at the start of the stream is done
        self._last_id: str | None = None

    def feed(self, data: bytes) -> list[SseEvent]:
        """Add the next bytes of the body; return the events they complete."""
        if (
            self._started
            and not self._buf
            and not self._pending_cr
            and data.startswith(b"data: ")
            and data.find(b"\n") == len(data) - 2
            and data.endswith(b"\n\n")
            and b"\r" not in data
        ):  # a read of exactly one one-line event, nothing pending: paced streams' usual read
            return [SseEvent(data[6:-2].decode("utf-8", "replace"), "message", self._last_id)]
        data = self._normalise_newlines(data)
        if not self._started:
            data = self._strip_bom(data)
            if not self._started:
                return []
        # The incomplete event grows in a bytearray (amortised appends, so a large event fed
        # in small pieces stays linear); a feed with nothing pending is parsed in place.
        buf: bytes | bytearray = data
        if self._buf:
            self._buf += data
            buf = self._buf
        events: list[SseEvent] = []
        pos = 0
        end = buf.find(b"\n\n", self._scan_from)
        while end >= 0:
            if end > pos:
                event = self._parse_block(buf[pos:end].decode("utf-8", "replace"))
                if event is not None:
                    events.append(event)
            pos = end + 2
            end = buf.find(b"\n\n", pos)
        self._keep(buf, pos)
        return events

    def close(self) -> list[SseEvent]:
        """End of the body: an event without its terminating blank line is discarded (spec)."""
        self._buf = bytearray()
        self._scan_from = 0
        return []

    def _keep(self, buf: bytes | bytearray, pos: int) -> None:
        size = len(buf) - pos
        if size > self._limit:
            raise SseEventTooLargeError(size, self._limit)
        if buf is not self._buf or pos:
            self._buf = bytearray(buf[pos:])
        # A blank line may straddle the next split: resume one byte back.
        self._scan_from = max(size - 1, 0)

    def _normalise_newlines(self, data: bytes) -> bytes:
        if not data:
            return data
        if self._pending_cr and data[:1] == b"\n":
            data = data[1:]  # the LF of a CRLF split across two feeds
        if b"\r" not in data:
            self._pending_cr = False
            return data
        self._pending_cr = data.endswith(b"\r")
        return data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")

    def _strip_bom(self, data: bytes) -> bytes:
        head = bytes(self._buf) + data
        if len(head) < len(_BOM) and _BOM.startswith(head):
            self._buf = bytearray(head)  # could still be a BOM: wait for more bytes
            return b""
        self._started = True
        self._buf = bytearray()
        return head[len(_BOM) :] if head.startswith(_BOM) else head

    def _parse_block(self, block: str) -> SseEvent | None:
        # Fast path: the usual provider event is one "data: ..." line.
        if block.startswith("data: ") and "\n" not in block:
            return SseEvent(block[6:], "message", self._last_id)
        data: list[str] = []
        event = ""
        for line in block.split("\n"):
            if not line or line[0] == ":":
                continue
            field, _, value = line.partition(":")
            if value[:1] == " ":
                value = value[1:]
            if field == "data":
                data.append(value)
            elif field == "event":
                event = value
            elif field == "id" and "\0" not in value:
                self._last_id = value
        if not data:
            return None
        return SseEvent("\n".join(data), event or "message", self._last_id)
