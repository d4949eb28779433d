"""``HttpClient.send``: a request on a pooled connection goes out before its answer is awaited
(the gateway calls the provider, then sets the step up while the provider works), and a
pending post given up closes its connection. A real loopback server is the oracle: it
records when each request arrived and when each connection ended."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tokenwire.providers._http import HttpClient, HttpResponse

OK = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"


class Recorder:
    """Answers every request with ``OK`` on keep-alive connections; counts requests and the
    connections the client closed."""

    def __init__(self) -> None:
        self.requests = 0
        self.arrived = asyncio.Event()
        self.closed = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                self.requests += 1
                self.arrived.set()
                writer.write(OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            self.closed.set()
        finally:
            writer.close()


@pytest.fixture
async def served() -> AsyncIterator[tuple[str, Recorder, HttpClient]]:
    recorder = Recorder()
    server = await asyncio.start_server(recorder.serve, "127.0.0.1", 0)
    client = HttpClient(keepalive_s=30)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/x", recorder, client
    finally:
        await client.close()
        server.close()


async def _body(response: HttpResponse) -> bytes:
    """The whole body, the connection released (pooled, read to its end)."""
    body = await response.read_up_to(1 << 16)
    response.release()
    return body


async def _pool_one(url: str, recorder: Recorder, client: HttpClient) -> None:
    """One request read to its end: its connection is pooled."""
    assert await _body(await client.post(url, b"{}", {})) == b"ok"
    recorder.arrived.clear()


async def test_a_send_on_a_pooled_connection_reaches_the_server_before_its_answer_is_awaited(
    served: tuple[str, Recorder, HttpClient],
) -> None:
    url, recorder, client = served
    await _pool_one(url, recorder, client)
    pending = client.send(url, b"{}", {})
    async with asyncio.timeout(10):
        await recorder.arrived.wait()  # response() not awaited yet
    assert recorder.requests == 2
    assert await _body(await pending.response()) == b"ok"


async def test_a_send_without_a_pooled_connection_connects_when_the_answer_is_awaited(
    served: tuple[str, Recorder, HttpClient],
) -> None:
    url, recorder, client = served
    pending = client.send(url, b"{}", {})
    await asyncio.sleep(0)  # a turn of the loop: nothing was sent, no connection is open
    assert recorder.requests == 0
    assert (await _body(await pending.response()), recorder.requests) == (b"ok", 1)


async def test_a_cancelled_send_closes_the_connection_it_went_out_on(
    served: tuple[str, Recorder, HttpClient],
) -> None:
    url, recorder, client = served
    await _pool_one(url, recorder, client)
    pending = client.send(url, b"{}", {})
    pending.cancel()
    async with asyncio.timeout(10):
        await recorder.closed.wait()
    # the next request does not reuse the closed connection, and is answered
    assert await _body(await client.post(url, b"{}", {})) == b"ok"


async def test_a_cancelled_send_that_never_connected_sends_nothing(
    served: tuple[str, Recorder, HttpClient],
) -> None:
    url, recorder, client = served
    client.send(url, b"{}", {}).cancel()
    body = await _body(await client.post(url, b"{}", {}))  # a fresh connection: the count
    assert (body, recorder.requests) == (b"ok", 1)


async def test_a_refused_header_is_raised_by_the_answer_not_by_send(
    served: tuple[str, Recorder, HttpClient],
) -> None:
    url, recorder, client = served
    pending = client.send(url, b"{}", {"x-bad": "a\r\nb"})  # never raises
    with pytest.raises(ValueError, match="x-bad"):
        await pending.response()
    assert recorder.requests == 0
