"""``serve`` (the CLI's entry) on a real socket: ready callback, health, clean cancellation."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from tokenwire.services.scripted_provider import (
    ScriptedServer,
    ScriptedSettings,
    ServerStartError,
    serve,
)


async def test_serve_announces_its_url_and_stops_on_cancel() -> None:
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(serve("127.0.0.1", 0, ScriptedSettings(), on_ready=ready.set_result))
    url = await asyncio.wait_for(ready, timeout=10)
    async with httpx.AsyncClient(base_url=url) as http:
        assert (await http.get("/healthz")).status_code == 200
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    async with httpx.AsyncClient(base_url=url) as http:
        with pytest.raises(httpx.ConnectError):
            await http.get("/healthz")


async def test_a_busy_port_is_a_start_error() -> None:
    async with ScriptedServer() as first:
        with pytest.raises(ServerStartError) as info:
            async with ScriptedServer(port=first.port):
                pass
    assert info.value.port == first.port


async def test_a_stream_waits_first_token_s_between_its_headers_and_its_first_event() -> None:
    """``first=0.3``: the headers come at once, the first event not before 0.3 s after them
    (a lower bound of the scripted wait, never an upper one)."""
    body = {
        "model": "scripted/text?first=0.3",
        "stream": True,
        "messages": [{"role": "user", "content": "hi"}],
    }
    async with ScriptedServer(ScriptedSettings()) as server, httpx.AsyncClient() as client:
        url = server.url + "/v1/chat/completions"
        async with client.stream("POST", url, json=body, timeout=10) as response:
            headers_at = time.monotonic()
            assert response.status_code == 200
            chunks = response.aiter_bytes()
            first = await anext(chunks)
            waited = time.monotonic() - headers_at
            rest = b"".join([part async for part in chunks])
    assert first.startswith(b"data: ")
    assert waited >= 0.3 - 0.01  # monotonic clock granularity
    assert (first + rest).endswith(b"data: [DONE]\n\n")
