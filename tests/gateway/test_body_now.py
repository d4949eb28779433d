"""The server's ``BODY_NOW`` write (``_api/edge.py``, issue 47): over a real socket a body
written through it arrives as the same chunked bytes uvicorn's own ``send`` writes, and it
writes nothing (False) whenever ``send`` would do anything else."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import uvicorn

from tokenwire.services.gateway._api.edge import BodyNow, EdgeLimits, bounded_protocol
from tokenwire.services.gateway._output.caller import BODY_NOW

PIECES = [b"data: one\n\n", b"data: \xc3\xa9t\xc3\xa9\n\n", b"x" * 70_000, b"data: [DONE]\n\n"]
App = Callable[..., Any]


@contextlib.asynccontextmanager
async def serving(app: App) -> AsyncIterator[int]:
    """``app`` on the gateway's own uvicorn protocol, on a free port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    http = bounded_protocol(EdgeLimits())
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False, http=http)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(30):
            while not server.started:  # noqa: ASYNC110 - uvicorn's flag, no event to wait on
                await asyncio.sleep(0.01)
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await task
        sock.close()


async def raw_get(port: int, method: str = "GET") -> bytes:
    """The whole response to one request on a closing connection, as the socket carried it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{method} / HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n".encode())
    try:
        async with asyncio.timeout(30):
            return await reader.read(-1)
    finally:
        writer.close()


def streaming_app(use_now: bool, seen: list[bool]) -> App:
    """A streaming response of :data:`PIECES`, each through ``BODY_NOW`` (when ``use_now``
    and offered; ``seen`` records what it answered) or else ``send``."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        now = scope.get("extensions", {}).get(BODY_NOW, {}).get("write")
        seen.append(now is not None)
        head = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        for piece in PIECES:
            if not (use_now and now is not None and now(piece)):
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def _head_and_body(response: bytes) -> tuple[list[bytes], bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"date:")]
    return lines, body


async def test_a_body_written_now_is_the_bytes_send_writes():
    seen: list[bool] = []
    async with serving(streaming_app(True, seen)) as port:
        fast = await raw_get(port)
    async with serving(streaming_app(False, seen)) as port:
        slow = await raw_get(port)
    assert seen == [True, True]  # offered by the gateway's protocol
    assert _head_and_body(fast) == _head_and_body(slow)
    body = _head_and_body(fast)[1]
    assert body.startswith(b"%x\r\n" % len(PIECES[0]) + PIECES[0] + b"\r\n")
    assert body.endswith(b"0\r\n\r\n")


async def test_nothing_is_written_now_before_the_start_or_for_a_head_request():
    answers: list[bool] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        now = scope["extensions"][BODY_NOW]["write"]
        answers.append(now(b"early"))  # the response has not started
        await send({"type": "http.response.start", "status": 200, "headers": []})
        answers.append(now(b"body"))  # a HEAD response has no body
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        answers.append(now(b"late"))  # the response is complete

    async with serving(app) as port:
        response = await raw_get(port, "HEAD")
    assert answers == [False, False, False]
    assert b"early" not in response
    assert b"late" not in response


async def test_nothing_is_written_now_for_a_sized_body():
    answers: list[bool] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        now = scope["extensions"][BODY_NOW]["write"]
        head = [(b"content-length", b"2")]
        await send({"type": "http.response.start", "status": 200, "headers": head})
        answers.append(now(b"ok"))  # not chunked: send counts the length
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})

    async with serving(app) as port:
        response = await raw_get(port)
    assert answers == [False]
    assert response.endswith(b"\r\n\r\nok")


def test_nothing_is_written_now_while_the_socket_is_full_or_the_caller_gone():
    writes: list[bytes] = []
    cycle: Any = SimpleNamespace(
        response_started=True,
        response_complete=False,
        disconnected=False,
        flow=SimpleNamespace(write_paused=True),  # uvicorn's flow control: send would wait
        chunked_encoding=True,
        scope={"method": "POST"},
        transport=SimpleNamespace(write=writes.append),
    )
    now = BodyNow(cycle).write
    assert not now(b"a")
    cycle.flow.write_paused = False
    cycle.disconnected = True
    assert not now(b"b")
    cycle.disconnected = False
    assert now(b"c")
    assert writes == [b"1\r\nc\r\n"]
