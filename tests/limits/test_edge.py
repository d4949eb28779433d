"""The HTTP edge's bounds over real sockets against the real gateway (issue 12, part 3).

Before: no header size or count limit (eight unfinished 64 MB headers took the gateway from
124 MB to 694 MB), no header read timeout (300 slow-header connections all open after 60 s),
no concurrency limit, and a deeply nested JSON body answered a plain-text 500. Each bound now
answers in the caller's dialect (by path) and never 500.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from tests.limits.rig import AUTH, limit_rig
from tokenwire.services.gateway._api.edge import KEEP_ALIVE_S, EdgeLimits

pytestmark = pytest.mark.slow
EDGE = EdgeLimits(header_timeout_s=0.5, body_timeout_s=0.5, max_connections=8)


async def exchange(url: str, data: bytes, *, then_wait: bool = False) -> tuple[int, Any, bytes]:
    """Send raw bytes; the status, JSON body and raw head of the answer (bounded)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(20):
            raw = await reader.read()  # the gateway answers and closes
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body), head


def request(path: str, *headers: bytes, body: bytes = b"") -> bytes:
    lines = [b"POST " + path.encode() + b" HTTP/1.1", b"host: gw", *headers]
    if body:
        lines.append(b"content-length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def assert_dialect(path: str, body: Any) -> None:
    if path == "/v1/messages":
        assert body["type"] == "error"
        assert body["error"]["message"]
    else:
        assert body["error"]["message"]
        assert "type" in body["error"]


PATHS = ["/v1/chat/completions", "/v1/messages"]


@pytest.fixture
async def rig(nc, topology, nats_url, sqlite_url):
    async with limit_rig(nc, topology, nats_url, sqlite_url, edge=EDGE) as rig:
        yield rig


@pytest.mark.parametrize("path", PATHS)
async def test_oversized_and_too_many_headers_answer_431_in_dialect(rig, path):
    big = b"x-big: " + b"a" * (EDGE.max_header_bytes + 1)
    status, body, _ = await exchange(rig.url, request(path, big))
    assert status == 431
    assert_dialect(path, body)
    many = [b"x-h%d: v" % i for i in range(EDGE.max_headers + 1)]
    status, body, _ = await exchange(rig.url, request(path, *many))
    assert status == 431
    assert_dialect(path, body)


@pytest.mark.parametrize("path", PATHS)
async def test_slow_headers_and_slow_bodies_answer_408_in_dialect(rig, path):
    partial = request(path).removesuffix(b"\r\n")  # the headers never end
    status, body, _ = await exchange(rig.url, partial)
    assert status == 408
    assert_dialect(path, body)
    started = (
        request(path, AUTH_HEADER, b"content-type: application/json", b"content-length: 100")
        + b'{"model"'
    )
    status, body, _ = await exchange(rig.url, started)
    assert status == 408
    assert_dialect(path, body)


AUTH_HEADER = b"authorization: " + AUTH["authorization"].encode()


async def test_over_the_connection_limit_answers_503_with_retry_after(rig):
    idle = [
        await asyncio.open_connection(*rig.url.removeprefix("http://").split(":"))
        for _ in range(EDGE.max_connections)
    ]
    try:
        status, body, head = await exchange(rig.url, request("/v1/messages", AUTH_HEADER))
        assert status == 503
        assert b"retry-after: 1" in head
        assert body["error"]["type"] == "overloaded_error"
    finally:
        for _, writer in idle:
            writer.close()


@pytest.mark.parametrize("path", PATHS)
async def test_deeply_nested_json_is_a_400_in_dialect(rig, path):
    deep = b'{"model": "openai/x", "max_tokens": 5, "messages": ' + b"[" * 100_000
    deep += b"]" * 100_000 + b"}"
    async with httpx.AsyncClient(base_url=rig.url, timeout=30) as client:
        response = await client.post(
            path, content=deep, headers={**AUTH, "content-type": "application/json"}
        )
    assert response.status_code == 400
    assert_dialect(path, response.json())
    assert "nested too deeply" in response.text


def test_keep_alive_outlasts_the_sdk_pools_idle_expiry():
    """The reported connection errors before any response byte: uvicorn closed idle
    keep-alive connections after 5 s, exactly when httpx's pool (both SDKs) may still reuse
    them (its ``keepalive_expiry`` is 5 s too). The gateway keeps them longer."""
    expiry = httpx.Limits().keepalive_expiry
    assert expiry is not None
    assert 2 * expiry < KEEP_ALIVE_S
