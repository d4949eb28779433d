"""In-memory implementations of the gateway's seams, for unit tests of the gateway alone.

They never replace the real broker or a real provider in tests that claim the system works.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field

from tokenwire.broker import BrokerUnavailable, PublisherStats
from tokenwire.providers import Normaliser, ProviderHTTPError
from tokenwire.schemas import ChunkEnvelope, StreamChunk, envelope_decoder
from tokenwire.services.gateway._identity import StepTaken
from tokenwire.services.gateway._routing import Route
from tokenwire.sse import SseParser

CannedAnswer = bytes | ProviderHTTPError
"""An SSE body to stream, or the HTTP error to raise before any chunk."""


@dataclass
class Published:
    """One message as the sink received it."""

    envelope: ChunkEnvelope
    first: bool
    headers: dict[str, str]
    raw: bytes


@dataclass
class MemorySink:
    """Records every publish; ``fail_after`` makes publishes past that count raise."""

    messages: list[Published] = field(default_factory=list)
    fail_after: int | None = None
    fail_acks: bool = False

    async def publish(
        self,
        envelope_bytes: bytes,
        session: str,
        turn: int,
        step: int,
        ordinal: int,
        *,
        first: bool,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Record the message, or raise BrokerUnavailable once ``fail_after`` is reached."""
        if self.fail_after is not None and len(self.messages) >= self.fail_after:
            raise BrokerUnavailable("memory://", "configured to fail")
        envelope = envelope_decoder.decode(envelope_bytes)
        self.messages.append(Published(envelope, first, dict(headers or {}), envelope_bytes))

    async def wait_acked(
        self, session: str, turn: int, step: int, timeout_s: float | None = None
    ) -> None:
        """Acked at once, unless ``fail_acks``."""
        if self.fail_acks:
            raise BrokerUnavailable("memory://", "acks configured to fail")

    def stats(self) -> PublisherStats:
        """All published, all acked."""
        n = len(self.messages)
        return PublisherStats(n, n, 0, 0, 0, 0)


@dataclass
class MemorySteps:
    """Claims steps in a set; assigns like the broker's registry does."""

    claimed: set[tuple[str, int, int]] = field(default_factory=set)
    latest: dict[str, tuple[int, int]] = field(default_factory=dict)

    async def claim(self, session: str, turn: int, step: int) -> None:
        """Claim the triple or raise :class:`StepTaken`."""
        if (session, turn, step) in self.claimed:
            raise StepTaken(f"{session}/{turn}/{step}")
        self.claimed.add((session, turn, step))

    async def begin_next_step(self, session: str, new_turn: bool) -> Assigned:
        """Assigned at once: (0, 0) first; then (turn + 1, 0) for a new turn, else
        (turn, step + 1), skipping claimed triples."""
        turn, step = self.latest.get(session, (-1, -1))
        candidate = (0, 0) if turn < 0 else (turn + 1, 0) if new_turn else (turn, step + 1)
        while (session, *candidate) in self.claimed:
            candidate = (candidate[0], candidate[1] + 1)
        self.claimed.add((session, *candidate))
        self.latest[session] = candidate
        return Assigned(candidate)


@dataclass(frozen=True)
class Assigned:
    """An assignment already made (the in-memory allocator's pending step)."""

    triple: tuple[int, int]

    async def result(self) -> tuple[int, int]:
        """The assigned (turn, step)."""
        return self.triple

    def drop(self) -> None:
        """Nothing to forget."""


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
