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
from tokenwire.services.gateway._routing import Route
from tokenwire.sse import SseParser

CannedAnswer = bytes | ProviderHTTPError
"""An SSE body to stream, or the HTTP error to raise before any chunk."""


@dataclass
class CannedUpstream:
    """Answers every call with ``answer(route, body)``, parsed and normalised for real.

    ``requests`` records (route, body) of every call; ``split`` cuts bodies into pieces of that
    many bytes to exercise incremental parsing; ``pause_s`` sleeps between pieces.
    """

    answer: Callable[[Route, bytes], CannedAnswer]
    requests: list[tuple[Route, bytes]] = field(default_factory=list)
    split: int = 97
    pause_s: float = 0.0

    def stream(
        self, route: Route, body: bytes, normaliser: Normaliser
    ) -> AsyncGenerator[list[StreamChunk], None]:
        """Record the call and stream the canned answer, a list of chunks per piece."""
        self.requests.append((route, body))
        return self._chunks(self.answer(route, body), normaliser)

    async def _chunks(
        self, answer: CannedAnswer, normaliser: Normaliser
    ) -> AsyncGenerator[list[StreamChunk], None]:
        if isinstance(answer, ProviderHTTPError):
            raise answer
        parser = SseParser()
        for start in range(0, len(answer), self.split):
            if self.pause_s:
                await asyncio.sleep(self.pause_s)
            events = parser.feed(answer[start : start + self.split])
            yield [chunk for event in events for chunk in normaliser.feed(event)]
        yield [chunk for event in parser.close() for chunk in normaliser.feed(event)]
        yield normaliser.close()
