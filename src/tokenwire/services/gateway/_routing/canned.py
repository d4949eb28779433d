"""The gateway's upstream seam's canned twin, for unit tests of the gateway alone: every call
answered with a given SSE body (parsed and normalised for real) or HTTP error. The broker's
twins (``broker.MemoryPublisher``, ``broker.MemoryStepRegistry``) live beside the real ones.

It never replaces a real provider in tests that claim the system works.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field

from tokenwire.providers import Normaliser, ProviderHTTPError
from tokenwire.schemas import StreamChunk
from tokenwire.services.gateway._routing.routing import Route
from tokenwire.sse import SseParser

CannedAnswer = bytes | ProviderHTTPError
"""An SSE body to stream, or the HTTP error to raise before any chunk."""


@dataclass
class CannedUpstream:
    """Answers every call with ``answer(route, body)``, parsed and normalised for real.

    ``requests`` records (route, body) of every call and ``calls`` the calls sent; ``split``
    cuts bodies into pieces of that many bytes to exercise incremental parsing; ``pause_s``
    sleeps between pieces.
    """

    answer: Callable[[Route, bytes], CannedAnswer]
    requests: list[tuple[Route, bytes]] = field(default_factory=list)
    calls: list[CannedCall] = field(default_factory=list)
    split: int = 97
    pause_s: float = 0.0

    def send(self, route: Route, body: bytes) -> CannedCall:
        """Record the call; its answer streams when read."""
        self.requests.append((route, body))
        self.calls.append(CannedCall(self.answer(route, body), self.split, self.pause_s))
        return self.calls[-1]


@dataclass
class CannedCall:
    """One canned call (:meth:`CannedUpstream.send`); ``cancelled`` once given up unread."""

    answer: CannedAnswer
    split: int
    pause_s: float
    cancelled: bool = False
    read: bool = False

    def batches(
        self, normaliser: Normaliser, every_s: float = 0.0
    ) -> AsyncGenerator[list[StreamChunk], None]:
        """The canned answer, parsed and normalised, a list of chunks per piece (each piece
        ``every_s`` after the last as well, when coalescing)."""
        self.read = True
        return self._chunks(normaliser, every_s)

    def cancel(self) -> None:
        """Given up: marked (tests check that a step that never read its call let it go)."""
        if not self.read:
            self.cancelled = True

    async def _chunks(
        self, normaliser: Normaliser, every_s: float
    ) -> AsyncGenerator[list[StreamChunk], None]:
        if isinstance(self.answer, ProviderHTTPError):
            raise self.answer
        parser, body = SseParser(), self.answer
        for start in range(0, len(body), self.split):
            if self.pause_s or (every_s and start):
                await asyncio.sleep(self.pause_s + (every_s if start else 0.0))
            events = parser.feed(body[start : start + self.split])
            yield [chunk for event in events for chunk in normaliser.feed(event)]
        yield [chunk for event in parser.close() for chunk in normaliser.feed(event)]
        yield normaliser.close()
