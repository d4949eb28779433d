"""Frames (ADR 0024): the gateway publishes a step's consecutive chunks several per broker
message, in process on the in-memory publisher.

Expected chunks come from the provider normaliser run on the recording alone (the oracle of
test_streaming_unit.py); the frame shape from the wire contract (``chunk_envelopes``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

import httpx
import pytest

from tests.gateway._helpers import GATEWAY_KEY, Rig, make_rig, recording
from tests.gateway.test_streaming_unit import normalised
from tokenwire.broker import MemoryPublisher, header_size, msg_id
from tokenwire.config import ConfigError
from tokenwire.providers import OpenAIChatNormaliser
from tokenwire.schemas import Finish, TextDelta, chunk_envelopes, frame_head
from tokenwire.services.gateway import FramePolicy, GatewayServer, GatewaySettings
from tokenwire.services.gateway._steps import step as step_module
from tokenwire.services.gateway._steps.framing import Framer
from tokenwire.sse import SseParser

AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
BODY = recording("openai/chat-parallel-tool-calls-fragmented-usage.sse")
REQUEST = {
    "model": "openai/gpt-4o",
    "stream": True,
    "messages": [{"role": "user", "content": "hi"}],
}


def _frames(sink: MemoryPublisher) -> list[list[int]]:
    """The ordinals each published message carried, in publish order."""
    return [[e.ordinal for e in chunk_envelopes(raw)] for raw in sink.frames]


async def _post(rig: Rig) -> httpx.Response:
    async with rig.client(**AUTH) as client:
        response: httpx.Response = await client.post("/v1/chat/completions", json=REQUEST)
        return response


async def test_the_first_chunk_goes_alone_and_the_rest_in_frames_of_consecutive_chunks():
    rig = make_rig(BODY)
    response = await _post(rig)
    assert response.status_code == 200
    assert response.text.rstrip().endswith("data: [DONE]")
    envs = rig.envelopes()
    assert [e.chunk for e in envs] == normalised(BODY, OpenAIChatNormaliser())
    assert [e.ordinal for e in envs] == list(range(len(envs)))
    frames = _frames(rig.sink)
    assert frames[0] == [0]
    assert all(f == list(range(f[0], f[-1] + 1)) for f in frames)  # consecutive, in order
    assert [o for f in frames for o in f] == list(range(len(envs)))
    # the canned upstream reads 97 bytes at a time, far faster than the 200 ms linger: the
    # rest of the step lingers into one frame, sent at the finish
    assert len(frames) == 2
    first = [m for m in rig.sink.messages if m.envelope.ordinal == 0]
    assert [m.first for m in first] == [True]
    assert not any(m.first for m in rig.sink.messages if m.envelope.ordinal > 0)
    assert envs[0].request_time_ns is not None
    assert all(e.request_time_ns is None for e in envs[1:])
    assert all(raw.startswith(b'{"v":2,') for raw in rig.sink.frames)


async def test_frames_off_publishes_the_same_chunks_one_version_1_message_each():
    on, off = make_rig(BODY), make_rig(BODY, framing=FramePolicy(frames=False))
    await _post(on)
    await _post(off)
    assert [(e.ordinal, e.chunk) for e in off.envelopes()] == [
        (e.ordinal, e.chunk) for e in on.envelopes()
    ]
    assert len(off.sink.frames) == len(off.envelopes())
    assert not any(raw.startswith(b'{"v":2,') for raw in off.sink.frames)


async def test_without_linger_each_provider_read_is_one_message():
    rig = make_rig(BODY, framing=FramePolicy(linger_ms=0))
    rig.upstream.split = 400
    await _post(rig)
    # the chunks each 400-byte read brings, as the canned upstream feeds the normaliser
    parser, normaliser, ends, total = SseParser(), OpenAIChatNormaliser(), [], 0
    for start in range(0, len(BODY), 400):
        total += sum(len(normaliser.feed(e)) for e in parser.feed(BODY[start : start + 400]))
        ends.append(total)
    frames = _frames(rig.sink)
    assert frames[0] == [0]
    assert frames[1][0] == 1
    # every later message is exactly the chunks of one read: it ends where a read ended
    assert {f[-1] + 1 for f in frames[1:-1]} <= set(ends)
    assert len(frames) >= 4


async def test_a_lingering_frame_never_delays_the_callers_stream(monkeypatch):
    """Reads 30 ms apart, a linger longer than the test, over a real socket: the caller gets
    the fragments as they are read while the broker has only the first chunk; the step's end
    sends the rest before the terminator. (The linger is an hour, not the 1 s maximum a
    setting allows, so that no timer can fire on a slow machine and the frames are exact.)"""

    def hour_long(linger_s: float, head: Any, send: Any) -> Framer:
        return Framer(3600.0 if linger_s else linger_s, head, send)

    monkeypatch.setattr(step_module, "Framer", hour_long)
    rig = make_rig(BODY, framing=FramePolicy(linger_ms=1000))
    rig.upstream.split, rig.upstream.pause_s = 200, 0.03
    settings = dataclasses.replace(rig.settings, port=0)
    seen: list[int] = []  # chunks published when each piece reached the caller
    async with (
        GatewayServer(settings, rig.app.state.gateway.deps) as server,
        httpx.AsyncClient(base_url=server.url, headers=AUTH) as client,
        client.stream("POST", "/v1/chat/completions", json=REQUEST) as response,
    ):
        async for _ in response.aiter_bytes():
            seen.append(len(rig.sink.messages))
    assert len(seen) > 3
    assert set(seen[:-1]) == {1}  # only the first chunk on the broker while the caller read
    assert _frames(rig.sink) == [[0], list(range(1, len(rig.envelopes())))]
    assert isinstance(rig.envelopes()[-1].chunk, Finish)


async def test_a_frame_goes_by_its_linger_timer_when_the_provider_pauses():
    rig = make_rig(BODY, framing=FramePolicy(linger_ms=10))
    rig.upstream.split, rig.upstream.pause_s = 300, 0.06
    started = time.monotonic()
    await _post(rig)
    assert time.monotonic() - started > 0.06 * 3
    frames = _frames(rig.sink)
    # between reads 60 ms apart the 10 ms timer sent each read's chunks: several frames,
    # none of them holding two reads' worth beyond what one read brought
    assert len(frames) >= 4
    assert [o for f in frames for o in f] == list(range(len(rig.envelopes())))


async def test_frames_stay_under_the_brokers_message_size_and_a_large_delta_is_split():
    """max_payload 2,048: a 10 KB text delta is split into pieces that each fit a frame."""
    text = "x" * 10_000
    body = (
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
        b'"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n'
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
        b'"choices":[{"index":0,"delta":{"content":"' + text.encode() + b'"}}]}\n\n'
        b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
        b'"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
        b"data: [DONE]\n\n"
    )
    rig = make_rig(body, sink=MemoryPublisher(max_payload=2048))
    rig.upstream.split = 100_000
    response = await _post(rig)
    assert response.status_code == 200
    envs = rig.envelopes()
    streamed = "".join(e.chunk.text for e in envs if isinstance(e.chunk, TextDelta))
    assert streamed == text
    assert [e.ordinal for e in envs] == list(range(len(envs)))
    for raw, ordinals in zip(rig.sink.frames, _frames(rig.sink), strict=True):
        [m] = [m for m in rig.sink.messages if m.envelope.ordinal == ordinals[0]]
        ident = msg_id(envs[0].session, 0, 0, ordinals[0])
        assert header_size({**m.headers, "Nats-Msg-Id": ident}) + len(raw) <= 2048
    assert len(rig.sink.frames) >= 10_000 // 2048


async def test_concurrent_steps_never_share_a_frame():
    rig = make_rig(BODY)
    async with rig.client(**AUTH) as client:
        await asyncio.gather(*(client.post("/v1/chat/completions", json=REQUEST) for _ in range(8)))
    for raw in rig.sink.frames:
        envs = chunk_envelopes(raw)
        assert len({(e.session, e.turn, e.step) for e in envs}) == 1
    assert len({e.session for e in rig.envelopes()}) == 8


async def test_a_flush_waits_for_every_linger_send_even_one_its_wait_lets_start():
    """A timer that fires while the step flushes starts another send: the flush waits for
    it too, so the step never waits for its acks with a frame still on its way."""
    sent: list[int] = []
    gates = {1: asyncio.Event(), 2: asyncio.Event()}

    async def send(payload: bytes, ordinal: int) -> None:
        await gates[ordinal].wait()
        sent.append(ordinal)

    def head(ordinal: int, time_ns: int) -> tuple[bytes, int]:
        return frame_head(
            session="s", turn=0, step=0, ordinal=ordinal, time_ns=time_ns, provider="p", model="m"
        ), 10_000

    framer = Framer(0.01, head, send)
    await framer.add(TextDelta(0, "a"), 1, 0)
    assert not framer.read_done()  # lingers: a timer sends it
    await asyncio.sleep(0.05)  # the timer's send started, held at its gate
    await framer.add(TextDelta(0, "b"), 2, 1)
    assert not framer.read_done()
    flushing = asyncio.create_task(framer.flush())
    await asyncio.sleep(0.05)  # the second frame's timer fires while the flush waits
    gates[1].set()
    await asyncio.sleep(0.05)
    assert not flushing.done()  # the second frame is still on its way
    gates[2].set()
    await flushing
    assert sent == [1, 2]
    assert not framer.holding


async def test_append_takes_chunks_without_a_wait_until_the_next_would_overfill_the_frame():
    """The step's no-wait path: each chunk joins the open frame while it fits; the one that
    would take the frame past its payload limit is refused and changes nothing held."""
    sent: list[bytes] = []
    limit = 400

    async def send(payload: bytes, ordinal: int) -> None:
        sent.append(payload)

    def head(ordinal: int, time_ns: int) -> tuple[bytes, int]:
        return frame_head(
            session="s", turn=0, step=0, ordinal=ordinal, time_ns=time_ns, provider="p", model="m"
        ), limit

    framer = Framer(0.0, head, send)
    chunk = TextDelta(0, "x" * 40)
    ordinal = 1
    while framer.append(chunk, ordinal, 1_000 + ordinal):
        ordinal += 1
    assert framer.holding
    await framer.flush()
    [payload] = sent
    assert [e.ordinal for e in chunk_envelopes(payload)] == list(range(1, ordinal))
    assert [e.time_ns for e in chunk_envelopes(payload)] == [1_000 + o for o in range(1, ordinal)]
    assert len(payload) <= limit
    refused = b'[%d,{"type":"text-delta","index":0,"text":"%s"}]' % (ordinal - 1, b"x" * 40)
    assert len(payload) + 1 + len(refused) > limit  # the refused chunk would not have fitted
    assert framer.append(chunk, ordinal, 1_000 + ordinal)  # no frame open: it opens one
    assert framer.holding


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, FramePolicy(frames=True, linger_ms=200)),
        ({"TOKENWIRE_FRAME_LINGER_MS": "0"}, FramePolicy(frames=True, linger_ms=0)),
        ({"TOKENWIRE_FRAME_LINGER_MS": "1000"}, FramePolicy(frames=True, linger_ms=1000)),
        ({"TOKENWIRE_FRAMES": "false"}, FramePolicy(frames=False, linger_ms=200)),
    ],
)
def test_framing_settings_from_the_environment(env: dict[str, str], expected: FramePolicy):
    assert GatewaySettings.from_env(env).framing == expected


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"TOKENWIRE_FRAME_LINGER_MS": "-1"}, "expected 0..1000"),
        ({"TOKENWIRE_FRAME_LINGER_MS": "1001"}, "expected 0..1000"),
        ({"TOKENWIRE_FRAME_LINGER_MS": "soon"}, "expected an integer"),
        ({"TOKENWIRE_FRAMES": "maybe"}, "expected true or false"),
    ],
)
def test_framing_settings_out_of_bounds_are_configuration_errors(env: dict[str, str], message: str):
    with pytest.raises(ConfigError, match=message):
        GatewaySettings.from_env(env)
