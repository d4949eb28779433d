"""A held provider connection (``Connection.hold``, coalesced reads, ADR 0032) over real
sockets: the socket is not read while held, the next read takes everything that came, a held
connection never goes back to the pool, and the provider read loop holds only once a read
brought a chunk. The bytes on the wire are the tests' own (``test_http.Server``)."""

from __future__ import annotations

import asyncio
import fcntl
import socket
import struct
import termios
from collections.abc import Callable

from tests.providers.test_http import STREAM_HEAD, Server, client_for, read_request
from tokenwire.providers import OpenAIChatNormaliser, ProviderRequest, ProviderSession

EVENTS = [b'data: {"choices":[{"index":0,"delta":{"content":"%d"}}]}\n\n' % i for i in range(3)]


def _piece(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _unread(sock: socket.socket) -> int:
    """Bytes the kernel holds for ``sock`` that nobody has read yet."""
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0])


async def _until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Wait (bounded) for ``condition()``, a state another side of the socket changes."""
    for _ in range(int(timeout_s / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"not within {timeout_s} s: {what}")


async def test_a_held_socket_is_not_read_and_the_next_read_takes_all_that_came() -> None:
    sent = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD + _piece(EVENTS[0]))
        await writer.drain()
        await sent.wait()  # the client read the first piece and held the socket
        for event in EVENTS[1:]:  # two more writes, two segments on the wire
            writer.write(_piece(event))
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async with Server(handler) as server, client_for() as client:
        response = await client.post(server.url(), b"{}", {})
        assert await response.read() == EVENTS[0]
        response.hold()
        sent.set()
        transport = response._conn.transport
        assert transport is not None  # connected: the first piece was read
        sock = transport.get_extra_info("socket")
        await _until(lambda: _unread(sock) > 0, "the provider's later bytes in the kernel")
        await _until(lambda: _unread(sock) >= 2 * len(_piece(EVENTS[1])), "both pieces")
        assert response._conn._buffer == []  # held: nothing was read from the socket
        assert await response.read() == EVENTS[1] + EVENTS[2]  # one read takes both
        assert await response.read() == b""
        response.release()


async def test_a_held_connection_is_never_given_back_to_the_pool() -> None:
    heads: list[bytes] = []
    held = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader, heads)
            writer.write(STREAM_HEAD + _piece(EVENTS[0]))
            await writer.drain()
            await held.wait()
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    async with Server(handler) as server, client_for() as client:
        response = await client.post(server.url(), b"{}", {})
        assert await response.read() == EVENTS[0]
        response.hold()  # held before its end was read, then released unread
        response.release()
        held.set()
        again = await client.post(server.url(), b"{}", {})
        assert await again.read() == EVENTS[0]
        assert await again.read() == b""
        again.release()
    assert server.connections == 2  # the held one was closed, not reused
    assert len(heads) == 2


async def test_the_read_loop_holds_only_once_a_read_brought_a_chunk() -> None:
    """A read that brings no chunk (a comment, a keep-alive) is followed by the next read at
    once: coalescing never delays the step's first chunk."""
    read_first = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD + _piece(b": keep-alive\n\n"))
        await writer.drain()
        await read_first.wait()
        writer.write(_piece(EVENTS[0]) + b"0\r\n\r\n")
        await writer.drain()

    async with Server(handler) as server:
        request = ProviderRequest(server.url(), b"{}", {})
        async with ProviderSession() as session:
            batches = session.send(request).batches(OpenAIChatNormaliser(), every_s=30.0)
            assert await anext(batches) == []  # the comment: no chunk
            read_first.set()
            # a hold here would wait 30 s: the bound (20 s) fails the test instead
            first = await asyncio.wait_for(anext(batches), timeout=20.0)
            assert [c.text for c in first if hasattr(c, "text")] == ["0"]
            await batches.aclose()
