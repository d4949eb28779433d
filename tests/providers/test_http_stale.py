"""The provider client retries a reused connection the server closed before answering
(issue 12): a real loopback server answers one request with keep-alive, then closes that
connection as soon as the next request arrives, without a byte of response."""

from __future__ import annotations

import asyncio

import pytest

from tokenwire.providers._http import HttpClient
from tokenwire.providers._http_connection import TransportError

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


class StaleServer:
    """Connection 1: one answer, then a close on the next request. Later ones: answers."""

    def __init__(self) -> None:
        self.connections = 0
        self.requests = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        first_connection = self.connections == 1
        answered = 0
        try:
            while True:
                async with asyncio.timeout(10):
                    head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                self.requests += 1
                if first_connection and answered == 1:
                    return  # closes without answering: the stale keep-alive case
                writer.write(OK)
                await writer.drain()
                answered += 1
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError):
            pass
        finally:
            writer.close()


async def post_twice() -> tuple[bytes, StaleServer]:
    stale = StaleServer()
    server = await asyncio.start_server(stale.serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/x"
    client = HttpClient(keepalive_s=30)
    try:
        first = await client.post(url, b"{}", {"content-type": "application/json"})
        assert (await first.read(), await first.read()) == (b"ok", b"")
        first.release()  # back to the pool, kept alive
        second = await client.post(url, b"{}", {"content-type": "application/json"})
        return await second.read(), stale
    finally:
        await client.close()
        server.close()


async def test_a_reused_connection_closed_before_any_response_byte_is_retried_fresh() -> None:
    body, stale = await post_twice()
    assert body == b"ok"
    assert (stale.connections, stale.requests) == (2, 3)


async def test_a_fresh_connection_closed_before_answering_is_not_retried() -> None:
    async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/x"
    client = HttpClient()
    try:
        with pytest.raises(TransportError) as info:
            await client.post(url, b"{}", {})
        assert info.value.code == "server_disconnected"
    finally:
        await client.close()
        server.close()
