"""Normalise a whole recorded response body (``tokenwire fold --provider P FILE``)."""

from __future__ import annotations

from tokenwire.providers._registry import get_provider
from tokenwire.schemas import StreamChunk
from tokenwire.sse import SseParser


def normalise_body(provider: str, body: bytes) -> list[StreamChunk]:
    """The chunks ``provider``'s normaliser makes of a complete SSE ``body``.

    Raises UnknownProviderError for a name not in the provider table.
    """
    normaliser = get_provider(provider).normaliser()
    parser = SseParser()
    chunks: list[StreamChunk] = []
    for event in parser.feed(body) + parser.close():
        chunks.extend(normaliser.feed(event))
    chunks.extend(normaliser.close())
    return chunks
