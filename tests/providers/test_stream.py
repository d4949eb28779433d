"""stream_chunks over a real socket: HTTP errors, transport failures, truncated bodies."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from pathlib import Path

import pytest

from tests.providers.conftest import (
    RecordingServer,
    Route,
    check_contract,
    only,
    stream_over_socket,
)
from tokenwire.providers import (
    OpenAIChatNormaliser,
    ProviderHTTPError,
    ProviderRequest,
    ProviderSession,
    Timeouts,
    stream_chunks,
)
from tokenwire.schemas import BlockEnd, Finish, StepError, TextDelta

KEY = "sk-test-0123456789abcdef"


async def test_http_429_raises_typed_retryable_error_without_the_key(
    recording_server: RecordingServer,
) -> None:
    body = (
        b'{"error": {"message": "Rate limit reached for key ' + KEY.encode() + b'",'
        b' "type": "requests", "code": "rate_limit_exceeded"}}'
    )
    route = Route(body, [7], status=429, content_type="application/json")
    with pytest.raises(ProviderHTTPError) as info:
        await stream_over_socket(
            recording_server, route, OpenAIChatNormaliser(), authorization=f"Bearer {KEY}"
        )
    err = info.value
    assert (err.status, err.retryable, err.code) == (429, True, "rate_limit_exceeded")
    assert err.message == "Rate limit reached for key [redacted]"
    assert KEY not in str(err)
    assert route.requests[0][1]["authorization"] == f"Bearer {KEY}"  # it was sent, though


async def test_http_400_invalid_request_is_not_retryable(recording_server: RecordingServer) -> None:
    body = b'{"error": {"message": "bad model", "type": "invalid_request_error", "code": null}}'
    route = Route(body, [], status=400, content_type="application/json")
    with pytest.raises(ProviderHTTPError) as info:
        await stream_over_socket(recording_server, route, OpenAIChatNormaliser())
    assert (info.value.status, info.value.retryable, info.value.message) == (
        400,
        False,
        "bad model",
    )


async def test_http_503_with_a_plain_text_body(recording_server: RecordingServer) -> None:
    route = Route(b"upstream unavailable", [], status=503, content_type="text/plain")
    with pytest.raises(ProviderHTTPError) as info:
        await stream_over_socket(recording_server, route, OpenAIChatNormaliser())
    assert (info.value.status, info.value.retryable) == (503, True)
    assert info.value.message == "upstream unavailable"


async def test_connection_dropped_mid_body_ends_with_retryable_error_after_chunks(
    recordings: Path, recording_server: RecordingServer
) -> None:
    body = (recordings / "openai/chat-text-include-usage.sse").read_bytes()
    cut = body.index(b"data:", body.index(b'"content":" Mexico"'))  # after " of Mexico"
    route = Route(body[:cut], [100, 900], drop_after=True)
    chunks = await stream_over_socket(recording_server, route, OpenAIChatNormaliser())
    check_contract(chunks)
    assert "".join(d.text for d in only(chunks, TextDelta)) == "The capital of Mexico"
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert finish.error is not None
    assert finish.error.retryable is True
    assert "transport failure" in finish.error.message
    assert only(chunks, BlockEnd) == []  # a cut-off block is never presented as complete


async def test_body_cleanly_ended_before_done_is_finish_error(
    recordings: Path, recording_server: RecordingServer
) -> None:
    body = (recordings / "deepseek/chat-text-usage.sse").read_bytes()
    route = Route(body[: len(body) // 2], [17, 333])
    chunks = await stream_over_socket(recording_server, route, OpenAIChatNormaliser())
    check_contract(chunks)
    assert chunks[-1] == Finish(
        reason="error",
        error=StepError("stream ended before the provider finished", retryable=True),
    )
    assert "".join(d.text for d in only(chunks, TextDelta)).startswith("Sure! Here's")


async def test_connection_refused_is_a_finish_error() -> None:
    with socket.socket() as sock:  # a free port with nothing listening once closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    request = ProviderRequest(f"http://127.0.0.1:{port}/v1/chat/completions", b"{}", {})
    async with ProviderSession(Timeouts(connect_s=5.0)) as session:
        chunks = [c async for c in stream_chunks(session, request, OpenAIChatNormaliser())]
    assert len(chunks) == 1
    assert isinstance(chunks[0], Finish)
    assert chunks[0].error is not None
    assert chunks[0].error.code == "connect_error"
    assert chunks[0].error.retryable is True


async def test_read_timeout_is_a_finish_error() -> None:
    """A server that sends the headers and one event, then goes silent past the read timeout."""
    release, finished = asyncio.Event(), asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        event = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
        writer.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
        await writer.drain()
        await release.wait()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
        finished.set()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        request = ProviderRequest(f"http://127.0.0.1:{port}/", b"{}", {})
        async with ProviderSession(Timeouts(connect_s=5.0, read_s=0.2)) as session:
            chunks = [c async for c in stream_chunks(session, request, OpenAIChatNormaliser())]
    finally:
        release.set()
        await asyncio.wait_for(finished.wait(), 5)
        server.close()
        await server.wait_closed()
    assert only(chunks, TextDelta) == [TextDelta(index=0, text="x")]
    assert isinstance(chunks[-1], Finish)
    assert chunks[-1].error is not None
    assert chunks[-1].error.code == "read_timeout"


async def test_an_environment_proxy_carries_the_call_and_no_proxy_bypasses_it(
    recordings: Path, recording_server: RecordingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recording server plays the proxy: a proxied request names the absolute URL."""
    target = "http://provider.invalid/v1/chat/completions"
    route = Route((recordings / "deepseek/chat-text-usage.sse").read_bytes(), [50, 400])
    recording_server.serve(target, route)
    for name in ("HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{recording_server.port}")
    request = ProviderRequest(target, b"{}", {"content-type": "application/json"})

    async with ProviderSession(Timeouts(connect_s=10.0, read_s=10.0)) as session:
        chunks = [c async for c in stream_chunks(session, request, OpenAIChatNormaliser())]
    check_contract(chunks)
    assert "".join(d.text for d in only(chunks, TextDelta)).startswith("Sure! Here's")
    assert len(route.requests) == 1

    monkeypatch.setenv("NO_PROXY", "provider.invalid")
    async with ProviderSession(Timeouts(connect_s=10.0, read_s=10.0)) as session:
        chunks = [c async for c in stream_chunks(session, request, OpenAIChatNormaliser())]
    assert len(chunks) == 1  # straight to provider.invalid, which does not resolve
    assert isinstance(chunks[0], Finish)
    assert chunks[0].error is not None
    assert chunks[0].error.code == "connect_error"
    assert len(route.requests) == 1
