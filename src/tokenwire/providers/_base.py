"""The adapter seam: one normaliser per provider wire dialect (owned by the adapters work)."""

from __future__ import annotations

from typing import Protocol

from tokenwire.schemas import StreamChunk
from tokenwire.sse import SseEvent


class Normaliser(Protocol):
    """Turns one provider response's SSE events into stream chunks, obeying the adapter contract.

    One instance per step; synchronous and pure, so it is tested without a network. ``feed``
    returns the chunks an event completes (often none, sometimes several); ``close`` is called
    at the end of the body and returns what remains, always ending with exactly one ``finish``
    (``finish {error}`` when the body ended before the provider said it was done).
    Contract: ``usage`` before ``finish``; nothing after ``finish``; tool-call arguments are raw
    JSON strings; token usage is disjoint and never invented.
    """

    def feed(self, event: SseEvent) -> list[StreamChunk]: ...

    def close(self) -> list[StreamChunk]: ...
