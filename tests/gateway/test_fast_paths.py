"""The gateway's performance fast paths give the same results as the general paths.

Each fast path (bench/bench_gateway.py, docs/gateway-internals.md, "Performance") is checked
against an independent oracle: ``json.loads`` on the recorded events, the SSE parser of the adapters
work, the sink's own record of what was published, and the asyncio semantics a publisher
window must keep.
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from tests.gateway._helpers import GATEWAY_KEY, make_rig, recording
from tokenwire.broker._publisher import _Window
from tokenwire.services.gateway import GatewayServer, GatewaySettings
from tokenwire.services.gateway._dialects import frame
from tokenwire.sse import SseEvent, SseParser

USER = [{"role": "user", "content": "hi"}]
USAGE_RECORDING = "openai/chat-parallel-tool-calls-fragmented-usage.sse"


def _events(body: bytes) -> list[str]:
    """The data of every event of an SSE body with one ``data:`` line per event."""
    return [block.removeprefix("data: ") for block in body.decode().split("\n\n") if block]


def _is_usage_only(data: str) -> bool:
    if data == "[DONE]":
        return False
    decoded = json.loads(data)
    return decoded.get("usage") is not None and not decoded.get("choices")


async def _forwarded(body: bytes, *, include_usage: bool) -> bytes:
    rig = make_rig(body)
    request = {"model": "openai/gpt-4o", "messages": USER, "stream": True}
    if include_usage:
        request["stream_options"] = {"include_usage": True}
    async with rig.client(authorization=f"Bearer {GATEWAY_KEY}") as client:
        response = await client.post("/v1/chat/completions", json=request)
    assert response.status_code == 200
    return response.content


@pytest.mark.parametrize("spacing", ['"usage":null', '"usage": null'])
async def test_usage_strip_forwards_every_other_event_byte_for_byte(spacing: str) -> None:
    # '"usage":null' takes the no-decode fast path; '"usage": null' the decoding one.
    body = recording(USAGE_RECORDING).replace(b'"usage":null', spacing.encode())
    events = _events(body)
    assert sum(spacing in e for e in events) > 5  # the recording exercises the path
    got = await _forwarded(body, include_usage=False)
    want = [e for e in events if not _is_usage_only(e)]  # [DONE] is the gateway's own
    assert _events(got) == want
    assert sum(_is_usage_only(e) for e in events) == 1


async def test_usage_is_kept_when_the_caller_asked_for_it() -> None:
    body = recording(USAGE_RECORDING)
    got = await _forwarded(body, include_usage=True)
    assert _events(got) == _events(body)


@pytest.mark.parametrize(
    "event",
    [
        SseEvent('{"a":1}'),
        SseEvent("line one\nline two"),
        SseEvent('{"type":"ping"}', "ping"),
        SseEvent("é ünïcode ✓"),
    ],
)
def test_frame_round_trips_through_the_sse_parser(event: SseEvent) -> None:
    parser = SseParser()
    assert parser.feed(frame(event)) == [event]


@pytest.mark.parametrize("fragments", [3, 64, 150])
async def test_published_chunk_counter_matches_the_sink_after_the_step(fragments: int) -> None:
    # The counter is updated in groups of 64 and at the end of the step.
    body = b"".join(
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
        b'"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}\n\n'
        for _ in range(fragments)
    )
    body += (
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
        b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    )
    rig = make_rig(body)
    await _forwarded_with(rig)
    registry = rig.app.state.gateway.metrics.registry
    counted = registry.get_sample_value(
        "tokenwire_gateway_chunks_published_total", {"provider": "openai"}
    )
    assert counted == len(rig.sink.messages) > fragments


async def _forwarded_with(rig) -> None:
    request = {"model": "openai/gpt-4o", "messages": USER, "stream": True}
    async with rig.client(authorization=f"Bearer {GATEWAY_KEY}") as client:
        response = await client.post("/v1/chat/completions", json=request)
    assert response.text.endswith("data: [DONE]\n\n")


async def test_window_serves_waiters_first_come_first_served() -> None:
    window = _Window(1)
    assert window.try_take()
    assert not window.try_take()
    order: list[int] = []

    async def waiter(n: int) -> None:
        await window.take(5.0)
        order.append(n)

    tasks = [asyncio.create_task(waiter(n)) for n in range(3)]
    await asyncio.sleep(0)
    for _ in range(3):
        window.release()  # a slot goes straight to the oldest waiter
        assert not window.try_take()  # ... so none is free for a newcomer
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2]
    window.release()
    assert window.try_take()  # nobody waits: the released slot is free again


async def test_window_timeout_and_cancellation_lose_no_slot() -> None:
    window = _Window(1)
    assert window.try_take()
    with pytest.raises(TimeoutError):
        await window.take(0.01)
    cancelled = asyncio.create_task(window.take(5.0))
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    window.release()  # both gave up: the slot must not be lost to them
    assert window.try_take()
    assert not window.try_take()


async def test_window_slot_handed_to_a_waiter_that_gives_up_is_passed_on() -> None:
    window = _Window(1)
    assert window.try_take()
    first = asyncio.create_task(window.take(5.0))
    second = asyncio.create_task(window.take(5.0))
    await asyncio.sleep(0)
    window.release()  # handed to ``first``, which is cancelled before it resumes
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    await asyncio.wait_for(second, 1.0)  # the slot reached the next waiter
    assert not window.try_take()


async def test_gateway_listener_disables_nagle_for_accepted_connections() -> None:
    # Accepted sockets inherit TCP_NODELAY; without it the first body bytes of a response
    # waited for the caller's delayed ACK (~40 ms).
    rig = make_rig(b"")
    settings = GatewaySettings(port=0, keys=frozenset({GATEWAY_KEY}))
    server = GatewayServer(settings, rig.app.state.gateway.deps)
    try:
        assert server._sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        server._sock.close()


async def test_requests_past_the_direct_routes_are_starlettes() -> None:
    """Only POST to the two model endpoints skips Starlette: other methods, paths and the
    session routes answer as Starlette's router does (405, 404 in OpenAI's shape, 200)."""
    rig = make_rig(recording(USAGE_RECORDING))
    async with rig.client(authorization=f"Bearer {GATEWAY_KEY}") as client:
        wrong_method = await client.get("/v1/chat/completions")
        unknown = await client.post("/v1/chat/completions/extra", json={})
        health = await client.get("/healthz")
        served = await client.post(
            "/v1/chat/completions", json={"model": "openai/gpt-4o", "messages": USER}
        )
    assert wrong_method.status_code == 405
    assert unknown.status_code == 404
    assert unknown.json()["error"]["type"] == "invalid_request_error"
    assert health.json() == {"status": "ok"}
    assert served.status_code == 200
    assert served.json()["object"] == "chat.completion"


async def test_a_first_read_larger_than_the_caller_buffer_does_not_hang() -> None:
    """The first read is put into the outbox by the request's own task, before the response
    exists: it must not wait for room only that task's response would make."""
    body = recording(USAGE_RECORDING)
    rig = make_rig(body, caller_buffer_bytes=64)
    rig.upstream.split = len(body)  # the provider's first read brings the whole answer
    async with rig.client(authorization=f"Bearer {GATEWAY_KEY}") as client:
        async with asyncio.timeout(10):
            response = await client.post(
                "/v1/chat/completions",
                json={"model": "openai/gpt-4o", "messages": USER, "stream": True},
            )
    assert response.status_code == 200
    assert response.text.rstrip().endswith("data: [DONE]")
