"""``HttpClient.send`` / ``PendingPost`` and the pool: a connection is never
handed to two requests, a post read to its end and then cancelled keeps its pooled connection,
and only a connection the server closed before answering is retried (a provider silent past
``read_s`` is a read timeout, not a stale keep-alive). A real loopback server is the oracle: it
counts connections and requests, and can stay silent."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest

from tokenwire.providers._http import HttpClient, Timeouts
from tokenwire.providers._http_connection import TransportError

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


class Server:
    """Answers ``OK`` on keep-alive connections, except the requests numbered in ``silent``
    (from 0), which get nothing until the client closes. Every change sets ``changed``."""

    def __init__(self, silent: frozenset[int] = frozenset()) -> None:
        self.silent = silent
        self.connections = 0
        self.requests = 0
        self.ended = 0  # connections the client closed
        self.changed = asyncio.Event()

    async def until(self, what: Callable[[], bool], timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not what():
                self.changed.clear()
                await self.changed.wait()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.changed.set()
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                number, self.requests = self.requests, self.requests + 1
                self.changed.set()
                if number in self.silent:
                    await reader.read()  # nothing is answered; b"" once the client closed
                    return
                writer.write(OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.ended += 1
            self.changed.set()
            writer.close()


Served = tuple[str, Server, HttpClient]


async def _serving(server: Server, client: HttpClient) -> AsyncIterator[Served]:
    listening = await asyncio.start_server(server.serve, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{listening.sockets[0].getsockname()[1]}/v1/x", server, client
    finally:
        await client.close()
        listening.close()
        await server.until(lambda: server.ended == server.connections)


@pytest.fixture
async def served() -> AsyncIterator[Served]:
    async for served in _serving(Server(), HttpClient(keepalive_s=30)):
        yield served


@pytest.fixture
async def silent_second() -> AsyncIterator[Served]:
    """The second request is never answered; ``read_s`` is short."""
    client = HttpClient(Timeouts(connect_s=5.0, read_s=0.3), keepalive_s=30)
    async for served in _serving(Server(silent=frozenset({1})), client):
        yield served


async def _read_ok(client: HttpClient, url: str) -> None:
    """One request read to its end: its connection goes back to the pool."""
    response = await client.post(url, b"{}", {})
    assert (await response.read(), await response.read()) == (b"ok", b"")
    response.release()


async def test_two_sends_never_share_the_one_pooled_connection(
    served: Served,
) -> None:
    url, server, client = served
    await _read_ok(client, url)
    first, second = client.send(url, b"{}", {}), client.send(url, b"{}", {})
    await server.until(lambda: server.requests == 2)  # the first went out on the pooled one
    assert server.connections == 1
    for pending in (second, first):  # the second connects when its answer is awaited
        response = await pending.response()
        assert (await response.read(), await response.read()) == (b"ok", b"")
        response.release()
    assert (server.connections, server.requests) == (2, 3)


async def test_a_post_read_to_its_end_then_cancelled_keeps_its_pooled_connection(
    served: Served,
) -> None:
    """``StepRun._end`` cancels every call, read or not: a read one's connection stays pooled."""
    url, server, client = served
    pending = client.send(url, b"{}", {})
    response = await pending.response()
    assert (await response.read(), await response.read()) == (b"ok", b"")
    response.release()
    pending.cancel()
    await _read_ok(client, url)
    assert (server.connections, server.requests, server.ended) == (1, 2, 0)


async def test_a_provider_silent_on_a_reused_connection_is_a_read_timeout_not_a_retry(
    silent_second: Served,
) -> None:
    """The stale keep-alive retry is for a connection the server closed without answering;
    one the client closed after ``read_s`` of silence must not send the request again (it
    did: the request went out twice, on a fresh connection, and the wait doubled)."""
    url, server, client = silent_second
    await _read_ok(client, url)
    with pytest.raises(TransportError) as caught:
        async with asyncio.timeout(10):
            await client.send(url, b"{}", {}).response()
    assert caught.value.code == "read_timeout"
    await server.until(lambda: server.ended == 1)
    assert (server.connections, server.requests) == (1, 2)  # sent once, never again
