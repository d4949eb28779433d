"""Shared helpers for the adapter tests.

- :class:`RecordingServer` (fixture ``recording_server``): a real HTTP/1.1 server on a free
  loopback port that answers with a recorded body cut at random byte positions, each piece
  written and flushed on its own (chunked transfer encoding), so the adapters read it the way
  they read a provider: over a socket, in arbitrary pieces.
- :func:`normalise_bytes`: the same without a network, for many splits quickly.
- :func:`check_contract` / :func:`rebuild_blocks`: the adapter contract and a per-test
  reconstruction of each block from its deltas alone (independent of the adapter's block-end).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest

from tests.fixtures.recordings import recordings_dir
from tokenwire.providers import (
    Normaliser,
    ProviderRequest,
    ProviderSession,
    Timeouts,
    stream_chunks,
)
from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    BlockType,
    ContentBlock,
    Finish,
    ReasoningBlock,
    ReasoningDelta,
    StreamChunk,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallDelta,
    Usage,
)
from tokenwire.sse import SseEvent, SseParser

SEED = 1_234_567
"""The seed of every random split in these tests (printed by the tests that use it)."""


def random_cuts(size: int, rnd: random.Random, most: int = 60) -> list[int]:
    """Sorted random cut positions inside a body of ``size`` bytes (some repeated, some 0)."""
    return sorted(rnd.randrange(size + 1) for _ in range(rnd.randint(1, most)))


def pieces(body: bytes, cuts: list[int]) -> list[bytes]:
    """``body`` cut at ``cuts`` (empty pieces included: an empty read must be harmless)."""
    bounds = [0, *cuts, len(body)]
    return [body[a:b] for a, b in itertools.pairwise(bounds)]


def normalise_bytes(body: bytes, normaliser: Normaliser, cuts: list[int]) -> list[StreamChunk]:
    """Parse ``body`` fed in pieces, normalise it, close both: every chunk, in order."""
    parser = SseParser()
    out: list[StreamChunk] = []
    for piece in pieces(body, cuts):
        for event in parser.feed(piece):
            out += normaliser.feed(event)
    for event in parser.close():
        out += normaliser.feed(event)
    return out + normaliser.close()


@dataclass
class Route:
    body: bytes
    cuts: list[int]
    status: int = 200
    content_type: str = "text/event-stream; charset=utf-8"
    drop_after: bool = False  # close the socket without the terminating chunk
    requests: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)


class RecordingServer:
    """A loopback HTTP server answering each registered path with its recorded body."""

    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def serve(self, path: str, route: Route) -> str:
        """Register ``route`` at ``path``; return its URL."""
        self._routes[path] = route
        return f"http://127.0.0.1:{self.port}{path}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            path, headers, body = await self._read_request(reader)
            route = self._routes.get(path)
            if route is None:
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
            else:
                route.requests.append((path, headers, body))
                await self._respond(writer, route)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _read_request(
        self, reader: asyncio.StreamReader
    ) -> tuple[str, dict[str, str], bytes]:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        path = lines[0].split(" ")[1]
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        return path, headers, body

    async def _respond(self, writer: asyncio.StreamWriter, route: Route) -> None:
        writer.write(
            f"HTTP/1.1 {route.status} X\r\ncontent-type: {route.content_type}\r\n"
            "transfer-encoding: chunked\r\nconnection: close\r\n\r\n".encode()
        )
        for piece in pieces(route.body, route.cuts):
            if piece:  # an empty chunk would end the chunked body
                writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                await writer.drain()
                await asyncio.sleep(0)
        if not route.drop_after:
            writer.write(b"0\r\n\r\n")


@pytest.fixture
async def recording_server() -> AsyncIterator[RecordingServer]:
    """A started :class:`RecordingServer` on a free loopback port."""
    server = RecordingServer()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


async def stream_over_socket(
    server: RecordingServer, route: Route, normaliser: Normaliser, **headers: str
) -> list[StreamChunk]:
    """POST to ``route`` over a real socket and collect what :func:`stream_chunks` yields."""
    url = server.serve("/v1/chat/completions", route)
    body = msgspec.json.encode({"stream": True})
    request = ProviderRequest(url, body, {"content-type": "application/json", **headers})
    async with ProviderSession(Timeouts(connect_s=10.0, read_s=10.0)) as session:
        return [chunk async for chunk in stream_chunks(session, request, normaliser)]


def check_contract(chunks: list[StreamChunk]) -> None:
    """The adapter contract: one finish, last; at most one usage, right before it; blocks
    started before their deltas, ended once, never touched after their end."""
    finishes = [i for i, c in enumerate(chunks) if isinstance(c, Finish)]
    assert finishes == [len(chunks) - 1], "exactly one finish, and it is the last chunk"
    usages = [i for i, c in enumerate(chunks) if isinstance(c, Usage)]
    assert usages in ([], [len(chunks) - 2]), "at most one usage, right before finish"
    started: set[int] = set()
    ended: set[int] = set()
    for chunk in chunks:
        index = getattr(chunk, "index", None)
        if index is None:
            continue
        assert index not in ended, f"chunk for block {index} after its block-end: {chunk!r}"
        if isinstance(chunk, BlockStart):
            assert index not in started
            assert index == len(started), "block indexes are handed out 0, 1, 2, ..."
            started.add(index)
        else:
            assert index in started, f"{chunk!r} before its block-start"
        if isinstance(chunk, BlockEnd):
            ended.add(index)


def rebuild_blocks(chunks: list[StreamChunk]) -> dict[int, ContentBlock]:
    """Each block as its deltas alone spell it (first name and id seen win)."""
    kinds: dict[int, BlockType] = {}
    parts: dict[int, list[str]] = {}
    heads: dict[int, tuple[str, str]] = {}
    for chunk in chunks:
        match chunk:
            case BlockStart(index=i, block_type=kind):
                kinds[i] = kind
                parts[i] = []
            case TextDelta(index=i, text=text) | ReasoningDelta(index=i, text=text):
                parts[i].append(text)
            case ToolCallDelta(index=i, id=ident, name=name, arguments_delta=args):
                parts[i].append(args)
                if name is not None:
                    heads.setdefault(i, (ident, name))
            case _:
                pass
    blocks: dict[int, ContentBlock] = {}
    for i, kind in kinds.items():
        text = "".join(parts[i])
        if kind == "text":
            blocks[i] = TextBlock(text=text)
        elif kind == "reasoning":
            blocks[i] = ReasoningBlock(text=text)
        else:
            blocks[i] = ToolCallBlock(id=heads[i][0], name=heads[i][1], arguments=text)
    return blocks


def ended_blocks(chunks: list[StreamChunk]) -> list[ContentBlock]:
    """The blocks carried by block-end chunks, in index order."""
    ends = sorted((c.index, c.block) for c in chunks if isinstance(c, BlockEnd))
    return [block for _, block in ends]


def without_redacted(block: ContentBlock) -> ContentBlock:
    """A reasoning block without its opaque payload (the rebuild cannot see it)."""
    if isinstance(block, ReasoningBlock):
        return ReasoningBlock(text=block.text)
    return block


def only(chunks: list[StreamChunk], kind: type[Any]) -> list[Any]:
    return [c for c in chunks if isinstance(c, kind)]


Splitter = Callable[[bytes], list[int]]


def normalise_events(
    normaliser: Normaliser, events: Iterable[SseEvent], *, close: bool = True
) -> list[StreamChunk]:
    """Every chunk ``normaliser`` makes of ``events`` (and of its close, unless ``close=False``)."""
    chunks = [chunk for event in events for chunk in normaliser.feed(event)]
    return chunks + normaliser.close() if close else chunks


def recorded_events(folder: str, name: str) -> list[SseEvent]:
    """The events of recording ``<folder>/<name>.sse``, split by :func:`split_sse`."""
    return split_sse((recordings_dir() / folder / f"{name}.sse").read_bytes())


def split_sse(body: bytes) -> list[SseEvent]:
    """A deliberately naive SSE splitter (whole body, blank-line separated, one data line)."""
    events = []
    for block in body.decode("utf-8").replace("\r\n", "\n").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
        if "data" in fields:
            events.append(SseEvent(data=fields["data"], event=fields.get("event", "message")))
    return events


def check_block_lifecycles(chunks: list[StreamChunk]) -> None:
    """Per index: start, deltas, end; the deltas concatenate to exactly the ended block."""
    started: dict[int, str] = {}
    parts: dict[int, list[str]] = {}
    done: set[int] = set()
    for chunk in chunks:
        match chunk:
            case BlockStart(index=i, block_type=kind):
                assert i not in started
                started[i], parts[i] = kind, []
            case TextDelta(index=i, text=t) | ReasoningDelta(index=i, text=t):
                assert i in started
                assert i not in done
                parts[i].append(t)
            case ToolCallDelta(index=i, arguments_delta=t):
                assert i in started
                assert i not in done
                parts[i].append(t)
            case BlockEnd(index=i, block=block):
                assert i in started
                assert i not in done
                done.add(i)
                joined = "".join(parts[i])
                match block:
                    case TextBlock(text=text) | ReasoningBlock(text=text):
                        assert joined == text
                    case ToolCallBlock(arguments=arguments):
                        assert joined == arguments
    if truncated(chunks):  # a truncating finish leaves the blocks it cut open
        assert done <= set(started)
    else:
        assert done == set(started)


def recording_names(folder: str) -> list[str]:
    """The recordings of one provider folder, by name (without ``.sse``)."""
    return sorted(p.name.removesuffix(".sse") for p in (recordings_dir() / folder).glob("*.sse"))


def ended(chunks: list[StreamChunk]) -> dict[int, Any]:
    """The block each ``block-end`` carried, by index."""
    return {c.index: c.block for c in chunks if isinstance(c, BlockEnd)}


def truncated(chunks: list[StreamChunk]) -> bool:
    """Whether the step ended with a truncating (``max-tokens``) finish."""
    return isinstance(chunks[-1], Finish) and chunks[-1].reason == "max-tokens"


def ended_or_cut(chunks: list[StreamChunk]) -> dict[int, Any]:
    """Every block by index: as its ``block-end`` carried it, or, for a block a truncating
    finish left open, as its deltas spell it so far (what the fold keeps)."""
    out = ended(chunks)
    if truncated(chunks):
        out = {**{i: b for i, b in rebuild_blocks(chunks).items() if i not in out}, **out}
    return dict(sorted(out.items()))
