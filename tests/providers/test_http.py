"""HttpClient over real sockets: framing, keep-alive, TLS, proxies, bounds, failures.

Each test serves a hand-written HTTP/1.1 exchange from an asyncio server on loopback, so the
bytes on the wire are the test's own (the oracle), not another client's or server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import trustme
import uvloop

from tokenwire.providers import READ_BUFFER, HttpClient, Timeouts, TransportError, _http_connection

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
SSE = b"data: one\n\ndata: two\n\n"


class Server:
    """A loopback server: ``handler`` per connection; counts connections and request heads."""

    def __init__(self, handler: Handler, tls: ssl.SSLContext | None = None) -> None:
        self.handler = handler
        self.tls = tls
        self.connections = 0
        self.heads: list[bytes] = []
        self.port = 0
        self._handlers: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in self._handlers:
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    def url(self, scheme: str = "http", host: str = "127.0.0.1") -> str:
        return f"{scheme}://{host}:{self.port}/v1/chat/completions?x=1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            # cancelled at exit: ended quietly, so that the stream's callback finds no error
            with contextlib.suppress(
                ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError
            ):
                await self.handler(reader, writer)
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()


async def read_request(reader: asyncio.StreamReader, heads: list[bytes] | None = None) -> bytes:
    """One request's head and body (content-length framed); the head goes to ``heads``."""
    head = await reader.readuntil(b"\r\n\r\n")
    if heads is not None:
        heads.append(head)
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return await reader.readexactly(length)


def chunked(*pieces: bytes) -> bytes:
    return b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces) + b"0\r\n\r\n"


STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def keep_serving(server_heads: list[bytes]) -> Handler:
    """Answer every request on the connection with the two-event stream, chunked."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader, server_heads)
            writer.write(STREAM_HEAD + chunked(b"data: one\n\n", b"data: two\n\n"))
            await writer.drain()

    return handler


async def read_all(client: HttpClient, url: str, body: bytes = b"{}") -> tuple[int, bytes]:
    response = await client.post(url, body, {"content-type": "application/json"})
    data = b""
    while piece := await response.read():
        data += piece
    response.release()
    return response.status, data


async def read_then_fail(handler: Handler, timeouts: Timeouts | None = None) -> tuple[bytes, str]:
    """The first read of the answer ``handler`` serves, and the code of the failure after it."""
    async with Server(handler) as server, client_for(timeouts) as client:
        response = await client.post(server.url(), b"{}", {})
        first = await response.read()
        with pytest.raises(TransportError) as info:
            await response.read()
        response.release()
    return first, info.value.code


@contextlib.asynccontextmanager
async def client_for(
    timeouts: Timeouts | None = None,
    keepalive_s: float = 2.0,
    ssl_context: ssl.SSLContext | None = None,
) -> AsyncIterator[HttpClient]:
    """A client that ignores the environment's proxies."""
    client = HttpClient(timeouts, keepalive_s, ssl_context, proxies={})
    try:
        yield client
    finally:
        await client.close()


async def test_a_chunked_stream_is_read_and_the_connection_reused() -> None:
    heads: list[bytes] = []
    async with Server(keep_serving(heads)) as server, client_for() as client:
        first = await read_all(client, server.url(), b'{"a": 1}')
        second = await read_all(client, server.url(), b'{"a": 2}')
    assert first == second == (200, SSE)
    assert server.connections == 1
    head = heads[0].decode()
    assert head.startswith("POST /v1/chat/completions?x=1 HTTP/1.1\r\n")
    assert f"host: 127.0.0.1:{server.port}\r\n" in head
    assert "content-length: 8\r\n" in head
    assert "accept-encoding: identity\r\n" in head


async def test_an_idle_connection_expires_after_keepalive() -> None:
    heads: list[bytes] = []
    async with Server(keep_serving(heads)) as server, client_for(keepalive_s=0.05) as client:
        await read_all(client, server.url())
        await asyncio.sleep(0.2)
        assert await read_all(client, server.url()) == (200, SSE)
    assert server.connections == 2


async def test_a_response_left_unread_closes_its_connection() -> None:
    heads: list[bytes] = []
    async with Server(keep_serving(heads)) as server, client_for() as client:
        response = await client.post(server.url(), b"{}", {})
        response.release()  # not read to the end: the connection cannot carry another request
        assert await read_all(client, server.url()) == (200, SSE)
    assert server.connections == 2


async def test_connection_close_and_read_to_close_bodies() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n" + SSE)
        await writer.drain()

    async with Server(handler) as server, client_for() as client:
        assert await read_all(client, server.url()) == (200, SSE)
        assert await read_all(client, server.url()) == (200, SSE)
    assert server.connections == 2


async def test_a_content_length_body_cut_short_is_incomplete_body() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + SSE)
        await writer.drain()

    assert await read_then_fail(handler) == (SSE, "incomplete_body")


async def test_closed_before_any_answer_is_server_disconnected() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with Server(handler) as server, client_for() as client:
        with pytest.raises(TransportError) as info:
            await client.post(server.url(), b"{}", {})
    assert info.value.code == "server_disconnected"


async def test_an_invalid_response_is_a_transport_error() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async with Server(handler) as server, client_for() as client:
        with pytest.raises(TransportError) as info:
            await client.post(server.url(), b"{}", {})
    assert info.value.code == "transport_error"


async def test_a_gzip_body_is_decoded_across_reads() -> None:
    """The first read holds only part of the gzip header (nothing decodes yet): the body
    must not look ended."""
    packed = gzip.compress(SSE)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        for piece in (packed[:5], packed[5:]):
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with Server(handler) as server, client_for() as client:
        assert await read_all(client, server.url()) == (200, SSE)


async def test_an_unknown_content_encoding_is_refused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-encoding: br\r\ncontent-length: 3\r\n\r\nabc")
        await writer.drain()

    async with Server(handler) as server, client_for() as client:
        with pytest.raises(TransportError, match="unsupported content-encoding 'br'"):
            await client.post(server.url(), b"{}", {})


async def test_a_header_with_a_line_break_is_refused_before_sending() -> None:
    heads: list[bytes] = []
    async with Server(keep_serving(heads)) as server, client_for() as client:
        with pytest.raises(ValueError, match="not a valid name and value"):
            await client.post(server.url(), b"{}", {"authorization": "Bearer x\r\nevil: 1"})
    assert heads == []


async def test_an_unread_response_stops_reading_the_socket_past_the_buffer() -> None:
    """A fast provider and a slow reader: at most READ_BUFFER (plus one socket read) waits
    in memory; everything arrives once the reader reads."""
    total = 8 * READ_BUFFER
    piece = b"x" * 65536

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total)
        for _ in range(total // len(piece)):
            writer.write(piece)
            await writer.drain()

    async with Server(handler) as server, client_for() as client:
        response = await client.post(server.url(), b"{}", {})
        await asyncio.sleep(0.3)
        buffered = sum(len(b) for b in response._conn._buffer)
        assert READ_BUFFER < buffered <= READ_BUFFER + 512 * 1024
        received = len(await response.read_up_to(total + 1))
        response.release()
    assert received == total


async def test_a_silent_provider_is_a_read_timeout() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD + b"b\r\ndata: one\n\n\r\n")
        await writer.drain()
        await asyncio.sleep(2)

    failed = await read_then_fail(handler, Timeouts(read_s=0.2))
    assert failed == (b"data: one\n\n", "read_timeout")


# -- TLS and proxies ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


def tls_pair(ca: trustme.CA) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server context for "localhost", client context trusting ``ca``)."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(server)
    client = ssl.create_default_context()
    ca.configure_trust(client)
    return server, client


async def test_tls_with_a_trusted_certificate(ca: trustme.CA) -> None:
    heads: list[bytes] = []
    server_tls, client_tls = tls_pair(ca)
    async with (
        Server(keep_serving(heads), tls=server_tls) as server,
        client_for(ssl_context=client_tls) as client,
    ):
        assert await read_all(client, server.url("https", "localhost")) == (200, SSE)
        assert await read_all(client, server.url("https", "localhost")) == (200, SSE)
    assert server.connections == 1


async def test_tls_with_an_untrusted_certificate_is_a_connect_error(ca: trustme.CA) -> None:
    heads: list[bytes] = []
    server_tls, _ = tls_pair(ca)
    async with Server(keep_serving(heads), tls=server_tls) as server, client_for() as client:
        with pytest.raises(TransportError) as info:
            await client.post(server.url("https", "localhost"), b"{}", {})
    assert info.value.code == "connect_error"
    assert "CERTIFICATE_VERIFY_FAILED" in str(info.value)


async def tunnel_proxy(seen: list[bytes]) -> Handler:
    """A CONNECT proxy: records the CONNECT head, then pipes bytes both ways."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head)
        port = head.split(b" ")[1].decode().rsplit(":", 1)[1]
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", int(port))
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(65536):
                dst.write(data)
                await dst.drain()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            up_writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await up_writer.wait_closed()

    return handler


async def test_https_through_a_connect_tunnel_with_proxy_credentials(ca: trustme.CA) -> None:
    heads: list[bytes] = []
    seen: list[bytes] = []
    server_tls, client_tls = tls_pair(ca)
    async with (  # the proxy closes last: the TLS goodbyes travel through it
        Server(await tunnel_proxy(seen)) as proxy,
        Server(keep_serving(heads), tls=server_tls) as target,
    ):
        proxies = {"https": f"http://user:p%40ss@127.0.0.1:{proxy.port}"}
        client = HttpClient(ssl_context=client_tls, proxies=proxies)
        try:
            assert await read_all(client, target.url("https", "localhost")) == (200, SSE)
        finally:
            await client.close()
    connect = seen[0].decode()
    assert connect.startswith(f"CONNECT localhost:{target.port} HTTP/1.1\r\n")
    assert "proxy-authorization: Basic dXNlcjpwQHNz\r\n" in connect  # base64("user:p@ss")
    assert "proxy-authorization" not in heads[0].decode().lower()  # never to the provider


async def test_a_proxy_refusing_the_tunnel_is_a_connect_error() -> None:
    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 407 Proxy Authentication Required\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()

    async with Server(refuse) as proxy:
        client = HttpClient(proxies={"https": f"http://127.0.0.1:{proxy.port}"})
        try:
            with pytest.raises(TransportError) as info:
                await client.post("https://provider.invalid/v1/x", b"{}", {})
        finally:
            await client.close()
    assert info.value.code == "connect_error"
    assert "407" in str(info.value)


def test_the_client_runs_on_uvloop(ca: trustme.CA) -> None:
    """The gateway runs on uvloop: plain, TLS and keep-alive there too."""
    server_tls, client_tls = tls_pair(ca)

    async def scenario() -> tuple[int, int, list[tuple[int, bytes]]]:
        heads: list[bytes] = []
        async with (
            Server(keep_serving(heads)) as plain,
            Server(keep_serving(heads), tls=server_tls) as secure,
            client_for(ssl_context=client_tls) as client,
        ):
            results = [await read_all(client, plain.url()) for _ in range(2)]
            results += [await read_all(client, secure.url("https", "localhost")) for _ in range(2)]
        return plain.connections, secure.connections, results

    plain, secure, results = uvloop.run(scenario())
    assert (plain, secure) == (1, 1)
    assert results == [(200, SSE)] * 4


# -- what a review found (each failed before its fix) -----------------------------------------


async def test_an_informational_response_is_not_the_answer() -> None:
    """103 Early Hints before the 200: the caller gets the 200, and the next request on the
    connection gets its own answer."""
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for answer in (b"answer-1", b"answer-2"):
            await read_request(reader, heads)
            writer.write(b"HTTP/1.1 103 Early Hints\r\nlink: </x>; rel=preload\r\n\r\n")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 8\r\n\r\n" + answer)
            await writer.drain()

    async with Server(handler) as server, client_for() as client:
        first = await read_all(client, server.url())
        second = await read_all(client, server.url())
    assert (first, second) == ((200, b"answer-1"), (200, b"answer-2"))
    assert server.connections == 1


async def test_bytes_after_a_response_end_the_connection_not_the_response() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok" + b"HTTP/1.1 500 X\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async with Server(handler) as server, client_for() as client:
        assert await read_all(client, server.url()) == (200, b"ok")
        assert await read_all(client, server.url()) == (200, b"ok")
    assert server.connections == 2  # the first connection was not trusted again


async def test_a_refused_header_opens_no_connection() -> None:
    heads: list[bytes] = []
    async with Server(keep_serving(heads)) as server, client_for() as client:
        for headers in ({"x": "caf\u00e9\u2122"}, {"content-length ": "0"}, {"x": "a\x00b"}):
            with pytest.raises(ValueError, match="not a valid name and value"):
                await client.post(server.url(), b"{}", headers)
    assert server.connections == 0


async def test_a_paused_reader_is_not_a_silent_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past READ_BUFFER the socket is not read; that silence is ours: no read timeout, and the
    watchdog re-arms once per read_s instead of spinning."""
    checks = 0
    original = _http_connection.Connection._check_silence

    def counted(conn: _http_connection.Connection) -> None:
        nonlocal checks
        checks += 1
        original(conn)

    monkeypatch.setattr(_http_connection.Connection, "_check_silence", counted)
    total = 3 * READ_BUFFER

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total)
        writer.write(b"x" * total)
        await writer.drain()

    async with Server(handler) as server, client_for(timeouts=Timeouts(read_s=0.1)) as client:
        response = await client.post(server.url(), b"{}", {})
        await asyncio.sleep(0.6)  # six read timeouts' worth of not reading
        received = len(await response.read_up_to(total + 1))
        response.release()
    assert received == total
    assert checks < 30


async def test_a_read_to_close_body_cut_by_a_reset_is_incomplete() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\n\r\n" + SSE)
        await writer.drain()
        await asyncio.sleep(0.05)
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # RST, not FIN

    assert await read_then_fail(handler) == (SSE, "incomplete_body")


async def test_a_pooled_connection_its_server_closed_leaves_the_pool() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()  # then the handler ends: the server closes the idle connection

    async with Server(handler) as server, client_for(keepalive_s=0.2) as client:
        for _ in range(3):
            assert await read_all(client, server.url()) == (200, b"ok")
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.4)
        assert [conn for idle in client._idle.values() for conn in idle] == []


async def test_trailers_are_not_response_headers() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntrailer: x-usage\r\n"
            b"transfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\nx-usage: 42\r\n"
            b"content-type: evil/override\r\n\r\n"
        )
        await writer.drain()

    async with Server(handler) as server, client_for() as client:
        response = await client.post(server.url(), b"{}", {})
        assert await response.read_up_to(100) == b"ok"
        response.release()
    assert response.headers["content-type"] == "text/event-stream"
    assert "x-usage" not in response.headers


async def test_a_truncated_gzip_body_is_incomplete() -> None:
    packed = gzip.compress(SSE * 50)

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        cut = packed[: len(packed) // 2]
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: %d\r\n\r\n" % len(cut)
            + cut
        )
        await writer.drain()

    async with Server(handler) as server, client_for() as client:
        response = await client.post(server.url(), b"{}", {})
        with pytest.raises(TransportError) as info:
            await response.read_up_to(len(SSE) * 100)
        response.release()
    assert info.value.code == "incomplete_body"


async def test_the_request_line_cannot_be_broken_by_the_url() -> None:
    heads: list[bytes] = []
    async with Server(keep_serving(heads)) as server, client_for() as client:
        url = f"http://127.0.0.1:{server.port}/v1/models/my model:stream?alt=sse x"
        assert await read_all(client, url) == (200, SSE)
    assert heads[0].startswith(b"POST /v1/models/my%20model:stream?alt=sse%20x HTTP/1.1\r\n")


async def test_an_ipv6_target_is_bracketed_in_connect() -> None:
    seen: list[bytes] = []

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\n\r\n")
        await writer.drain()

    async with Server(refuse) as proxy:
        client = HttpClient(proxies={"https": f"http://127.0.0.1:{proxy.port}"})
        try:
            with pytest.raises(TransportError):
                await client.post("https://[::1]:8443/v1/x", b"{}", {})
        finally:
            await client.close()
    assert seen[0].startswith(b"CONNECT [::1]:8443 HTTP/1.1\r\n")
