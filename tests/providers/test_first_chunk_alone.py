"""The provider read loop hands the first chunk over alone (issue 47): the first read that
brings a chunk is split after the event that made it, so that the step answers its caller
before the rest of that read is normalised and published; every later read stays one list.
Real sockets, the tests' own bytes on the wire (``test_http.Server``)."""

from __future__ import annotations

import asyncio

from tests.providers.test_http import STREAM_HEAD, Server, read_request
from tokenwire.providers import OpenAIChatNormaliser, ProviderRequest, ProviderSession
from tokenwire.schemas import Finish, StreamChunk, TextDelta

EVENTS = [b'data: {"choices":[{"index":0,"delta":{"content":"%d"}}]}\n\n' % i for i in range(6)]
PING = b": keep-alive\n\n"


def _piece(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _texts(batch: list[StreamChunk]) -> list[str]:
    return [c.text for c in batch if isinstance(c, TextDelta)]


async def test_the_first_chunk_comes_alone_and_the_rest_of_its_read_after_it() -> None:
    later = asyncio.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        # one write, one read: a comment, then three events that each make a chunk
        writer.write(STREAM_HEAD + _piece(PING + b"".join(EVENTS[:3])))
        await writer.drain()
        await later.wait()  # the step took the first two lists
        writer.write(_piece(b"".join(EVENTS[3:])) + _piece(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()

    async with Server(handler) as server, ProviderSession() as session:
        request = ProviderRequest(server.url(), b"{}", {})
        batches = session.send(request).batches(OpenAIChatNormaliser())
        first = await anext(batches)
        assert _texts(first) == ["0"]  # the first chunk's event alone
        assert _texts(await anext(batches)) == ["1", "2"]  # the rest of the same read
        later.set()
        third = await anext(batches)
        assert _texts(third) == ["3", "4", "5"]  # a later read: one list, its finish too
        assert isinstance(third[-1], Finish)
        await batches.aclose()


async def test_a_first_read_with_one_chunk_is_one_list() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(STREAM_HEAD + _piece(EVENTS[0]))
        await writer.drain()
        writer.write(_piece(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        await writer.drain()

    async with Server(handler) as server, ProviderSession() as session:
        batches = session.send(ProviderRequest(server.url(), b"{}", {})).batches(
            OpenAIChatNormaliser()
        )
        first = await anext(batches)
        assert _texts(first) == ["0"]
        assert all(not _texts(batch) for batch in [b async for b in batches])
