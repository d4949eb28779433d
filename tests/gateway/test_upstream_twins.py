"""One contract suite for the gateway's own seam, ``Upstream``, over the real implementation
(``HttpUpstream``: a real HTTP call to a loopback server) and its canned twin
(``CannedUpstream``): for the same provider answer both yield the same chunks, and both raise
the same ``ProviderHTTPError`` for an error status (issue 13, part 3; the broker's seams have
theirs in tests/broker/test_twins.py).

The oracle is the adapter itself over the recorded bytes (``normalise_bytes``), neither seam's
output: both must equal it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable

import pytest

from tests.gateway._helpers import recording
from tests.providers.conftest import normalise_bytes
from tokenwire.providers import (
    AnthropicNormaliser,
    Dialect,
    Normaliser,
    OpenAIChatNormaliser,
    ProviderHTTPError,
)
from tokenwire.schemas import StreamChunk
from tokenwire.services.gateway import CannedUpstream, HttpUpstream, Route, Upstream
from tokenwire.services.gateway._routing.canned import CannedAnswer

CASES = [
    ("openai/chat-text-include-usage.sse", Dialect.OPENAI_CHAT, OpenAIChatNormaliser),
    (
        "openai/chat-parallel-tool-calls-fragmented-usage.sse",
        Dialect.OPENAI_CHAT,
        OpenAIChatNormaliser,
    ),
    ("anthropic/messages-thinking-then-text.sse", Dialect.ANTHROPIC_MESSAGES, AnthropicNormaliser),
]
ERROR = {"error": {"type": "rate_limit_error", "message": "slow down"}}


@contextlib.asynccontextmanager
async def provider(status: int, body: bytes) -> AsyncIterator[str]:
    """A loopback HTTP/1.1 server answering every request with ``status`` and ``body``."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            await reader.readexactly(length)
            kind = b"text/event-stream" if status == 200 else b"application/json"
            writer.write(
                b"HTTP/1.1 %d X\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
                % (status, kind, len(body), body)
            )
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    finally:
        server.close()
        await server.wait_closed()


def route(url: str, dialect: Dialect, make: Callable[[], Normaliser]) -> Route:
    return Route(provider="p", model="m", dialect=dialect, url=url, normaliser=make)


async def chunks_of(upstream: Upstream, r: Route) -> list[StreamChunk]:
    out: list[StreamChunk] = []
    async for batch in upstream.send(r, b"{}").batches(r.normaliser()):
        out += batch
    return out


async def both(status: int, body: bytes, dialect: Dialect, make: Callable[[], Normaliser]):
    """The real seam over HTTP and the canned twin, each with the same answer."""
    canned: CannedAnswer = body
    if status != 200:
        canned = ProviderHTTPError(status, ERROR["error"]["message"], retryable=True)
    async with provider(status, body) as url:
        real = HttpUpstream()
        try:
            yield (real, route(f"{url}/chat", dialect, make))
        finally:
            await real.aclose()
    yield (CannedUpstream(lambda _route, _body: canned), route("http://canned", dialect, make))


@pytest.mark.parametrize(("name", "dialect", "make"), CASES, ids=[c[0] for c in CASES])
async def test_both_seams_yield_the_adapters_chunks(name, dialect, make) -> None:
    body = recording(name)
    expected = normalise_bytes(body, make(), [])
    seen = 0
    async for upstream, r in both(200, body, dialect, make):
        assert await chunks_of(upstream, r) == expected, type(upstream).__name__
        seen += 1
    assert seen == 2


async def test_both_seams_raise_the_provider_s_error_status() -> None:
    body = json.dumps(ERROR).encode()
    seen = 0
    async for upstream, r in both(429, body, Dialect.OPENAI_CHAT, OpenAIChatNormaliser):
        with pytest.raises(ProviderHTTPError) as caught:
            await chunks_of(upstream, r)
        assert (caught.value.status, caught.value.retryable) == (429, True)
        assert "slow down" in caught.value.message
        seen += 1
    assert seen == 2


async def test_a_step_whose_set_up_fails_after_the_provider_call_was_sent_cancels_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The provider is called before the step is set up; a set-up that raises lets the sent
    call go (its connection closed) instead of leaving it unread."""
    from tests.gateway._helpers import GATEWAY_KEY, make_rig
    from tokenwire.services.gateway._api import app

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("set-up failed")

    monkeypatch.setattr(app, "start_step_span", broken)
    rig = make_rig(recording("openai/chat-text-include-usage.sse"))
    message = {"role": "user", "content": "x"}
    body = {"model": "openai/gpt-4o", "stream": True, "messages": [message]}
    async with rig.client(authorization=f"Bearer {GATEWAY_KEY}") as client:
        with pytest.raises(RuntimeError, match="set-up failed"):
            await client.post("/v1/chat/completions", json=body)
    assert [(c.read, c.cancelled) for c in rig.upstream.calls] == [(False, True)]
