"""A hostile upstream for the limit tests: an OpenAI-compatible streaming server on loopback
that sends what a misbehaving provider may send (huge blocks, endless streams, keep-alive
bytes only, chunks after ``[DONE]``).

Each request's ``model`` names a scenario and its arguments, ``name:arg:arg``. Bounded: every
response stops after ``max_bytes`` or ``max_seconds``, whichever comes first, and the server
listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

Scenario = Callable[..., AsyncIterator[bytes]]


def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-hostile",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "hostile",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


USAGE = (
    b'data: {"id":"chatcmpl-hostile","object":"chat.completion.chunk","created":1,'
    b'"model":"hostile","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":5,'
    b'"total_tokens":8}}\n\n'
)
DONE = b"data: [DONE]\n\n"


async def big_text(size: str, delta: str = "65536") -> AsyncIterator[bytes]:
    """One text block of ``size`` characters (ASCII), in deltas of ``delta`` characters."""
    total, step = int(size), int(delta)
    yield event({"role": "assistant", "content": ""})
    sent = 0
    while sent < total:
        n = min(step, total - sent)
        yield event({"content": _text(sent, n)})
        sent += n
    yield event({}, "stop")
    yield USAGE
    yield DONE


async def big_args(size: str, delta: str = "65536") -> AsyncIterator[bytes]:
    """One tool call whose arguments are ``size`` characters of JSON full of quotes."""
    total, step = int(size), int(delta)
    args = _arguments(total)
    head = {"index": 0, "id": "call_big", "type": "function", "function": {"name": "put"}}
    yield event(
        {
            "role": "assistant",
            "tool_calls": [{**head, "function": {"name": "put", "arguments": ""}}],
        }
    )
    for start in range(0, total, step):
        piece = args[start : start + step]
        yield event({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]})
    yield event({}, "tool_calls")
    yield USAGE
    yield DONE


def _text(start: int, n: int) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz "
    return "".join(alphabet[(start + i) % len(alphabet)] for i in range(n))


def _arguments(total: int) -> str:
    """Valid JSON of exactly ``total`` characters: {"v":"\\"\\"...x"} padded."""
    head, tail = '{"v":"', '"}'
    body = '\\"' * ((total - len(head) - len(tail)) // 2)
    body += "x" * (total - len(head) - len(tail) - len(body))
    return head + body + tail


_WORD_BEFORE, _WORD_AFTER = event({"content": "\x00"}).split(b"\\u0000")
"""``event({"content": word})`` around the word, for a word JSON does not escape: the
endless scenario sends the same bytes without encoding a dict per event (the test process
serves the streams, and its CPU is the suite's)."""


async def endless(pause_ms: str = "0") -> AsyncIterator[bytes]:
    """Text deltas for ever (until the server's bound), ``pause_ms`` apart."""
    yield event({"role": "assistant", "content": ""})
    n = 0
    while True:
        yield b"%sw%d %s" % (_WORD_BEFORE, n, _WORD_AFTER)  # event({"content": f"w{n} "})
        n += 1
        await asyncio.sleep(int(pause_ms) / 1000)


async def keepalive_only(pause_ms: str = "20") -> AsyncIterator[bytes]:
    """One delta, then only SSE comments (keep-alive bytes) for ever."""
    yield event({"role": "assistant", "content": "hello"})
    while True:
        await asyncio.sleep(int(pause_ms) / 1000)
        yield b": keep-alive\n\n"


EMPTY = b'data: {"id":"chatcmpl-hostile","object":"chat.completion.chunk","choices":[]}\n\n'
"""An event that carries nothing (no choices)."""


async def empty_events(pause_ms: str = "1") -> AsyncIterator[bytes]:
    """One delta, then events that carry nothing for ever."""
    yield event({"role": "assistant", "content": "hello"})
    while True:
        yield EMPTY * 64
        await asyncio.sleep(int(pause_ms) / 1000)


async def after_done() -> AsyncIterator[bytes]:
    """A normal stream, then more content after ``[DONE]``."""
    yield event({"role": "assistant", "content": "before"})
    yield event({}, "stop")
    yield USAGE
    yield DONE + event({"content": " EXTRA"}) + event({}, "stop") + DONE


async def many_open_calls(count: str = "70") -> AsyncIterator[bytes]:
    """``count`` tool calls streamed at once (all open until the finish)."""
    yield event({"role": "assistant"})
    for i in range(int(count)):
        call = {
            "index": i,
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "f", "arguments": '{"i": '},
        }
        yield event({"tool_calls": [call]})
    for i in range(int(count)):
        yield event({"tool_calls": [{"index": i, "function": {"arguments": f"{i}}}"}}]})
    yield event({}, "tool_calls")
    yield USAGE
    yield DONE


SCENARIOS: dict[str, Scenario] = {
    "big-text": big_text,
    "big-args": big_args,
    "endless": endless,
    "keepalive-only": keepalive_only,
    "empty-events": empty_events,
    "after-done": after_done,
    "many-open-calls": many_open_calls,
}


class HostileUpstream:
    """Serve :data:`SCENARIOS` (plus ``extra``) on a loopback port; ``url`` is its base."""

    def __init__(
        self,
        extra: dict[str, Scenario] | None = None,
        *,
        max_bytes: int = 256 * 1024 * 1024,
        max_seconds: float = 120.0,
    ) -> None:
        self._scenarios = {**SCENARIOS, **(extra or {})}
        self._max_bytes = max_bytes
        self._max_seconds = max_seconds
        self._server: asyncio.Server | None = None
        self.requests = 0
        self.sent_bytes = 0
        self.open_responses = 0
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def __aenter__(self) -> HostileUpstream:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while await self._one(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        async with asyncio.timeout(30):
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                header, _, value = line.partition(b":")
                if header.strip().lower() == b"content-length":
                    length = int(value)
            body = json.loads(await reader.readexactly(length))
        self.requests += 1
        name, *args = str(body["model"]).split(":")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        self.open_responses += 1
        try:
            await self._stream(self._scenarios[name](*args), writer)
        finally:
            self.open_responses -= 1
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    async def _stream(self, body: AsyncIterator[bytes], writer: asyncio.StreamWriter) -> None:
        started, sent = time.monotonic(), 0
        async for data in body:
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await writer.drain()
            sent += len(data)
            self.sent_bytes += len(data)
            if sent > self._max_bytes or time.monotonic() - started > self._max_seconds:
                return  # the bound: a hostile stream never runs away with the test
