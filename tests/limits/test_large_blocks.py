"""Large blocks through the real gateway and a real nats-server with the default 1 MiB
max_payload (issue 12, part 1).

Before: a text block just under 1 MiB made a block-end envelope that, with its headers, was
over the server's limit; the server closed the connection, nats-py closed the client for good,
and the gateway answered errors for ever while /healthz said 200. No block over ~1 MiB could be
captured. Oracle: the hostile upstream's own content generators.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable

import pytest

from tests.assembler.harness import eventually
from tests.limits.hostile import _arguments, _text
from tests.limits.rig import limit_rig, stream_text
from tokenwire.schemas import Message, RecordedError

pytestmark = pytest.mark.slow


def closed(nc) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return bool(nc.is_closed)

    return check


def session() -> str:
    return f"big-{uuid.uuid4().hex[:10]}"


async def test_a_block_just_under_one_mib_is_captured_and_the_gateway_stays_up(
    nc, topology, nats_url, sqlite_url
):
    size = 1_048_270  # the block: its block-end envelope was over 1 MiB with headers
    async with limit_rig(nc, topology, nats_url, sqlite_url) as rig:
        sid = session()
        beside = [session() for _ in range(20)]  # the load beside it lost 109 of 135
        results = await asyncio.gather(
            stream_text(rig.openai(sid), f"big-text:{size}"),
            *(stream_text(rig.openai(b), f"big-text:{200 + i}") for i, b in enumerate(beside)),
        )
        text, _, ending = results[0]
        assert (text, ending) == (_text(0, size), "stop")
        assert [r[::2] for r in results[1:]] == [(_text(0, 200 + i), "stop") for i in range(20)]
        recorded, *recorded_beside = await rig.recorded_all([sid, *beside])
        assert isinstance(recorded, Message), recorded
        assert recorded.text == _text(0, size)
        assert [m.text if isinstance(m, Message) else m for m in recorded_beside] == [
            _text(0, 200 + i) for i in range(20)
        ]
        # The connection survived: the next request is served, and both probes say so.
        small = session()
        assert await stream_text(rig.openai(small), "big-text:10") == (_text(0, 10), [""], "stop")
        assert nc.is_connected
        assert await rig.health() == (200, 200)


@pytest.mark.parametrize(
    ("size", "delta"),
    [
        (16 * 1024 * 1024, 256 * 1024),  # the documented bound, streamed in deltas
        (3 * 1024 * 1024, 3 * 1024 * 1024),  # one delta larger than a broker message
    ],
)
async def test_a_text_block_up_to_sixteen_mib_is_captured_whole(
    nc, topology, nats_url, sqlite_url, size, delta
):
    async with limit_rig(nc, topology, nats_url, sqlite_url) as rig:
        sid = session()
        text, _, ending = await stream_text(rig.openai(sid), f"big-text:{size}:{delta}")
        assert ending == "stop"
        assert text == _text(0, size)
        recorded = await rig.recorded(sid)
        assert isinstance(recorded, Message), recorded
        assert recorded.text == text


async def test_large_tool_call_arguments_escaped_twice_are_captured(
    nc, topology, nats_url, sqlite_url
):
    size = 2 * 1024 * 1024  # mostly \" pairs: each doubles again inside the envelope
    async with limit_rig(nc, topology, nats_url, sqlite_url) as rig:
        sid = session()
        _, args, ending = await stream_text(rig.openai(sid), f"big-args:{size}")
        assert (args, ending) == ([_arguments(size)], "tool_calls")
        recorded = await rig.recorded(sid)
        assert isinstance(recorded, Message), recorded
        assert [c.arguments for c in recorded.tool_calls] == [_arguments(size)]


async def test_a_block_beyond_the_bound_is_a_clear_error_and_a_recorded_limit(
    nc, topology, nats_url, sqlite_url
):
    size = 16 * 1024 * 1024 + 1
    async with limit_rig(nc, topology, nats_url, sqlite_url) as rig:
        sid = session()
        _, _, ending = await stream_text(rig.openai(sid), f"big-text:{size}:{256 * 1024}")
        assert ending.startswith("error: "), ending
        assert "max_step_bytes" in ending
        recorded = await rig.recorded(sid)
        assert isinstance(recorded, RecordedError), recorded
        assert recorded.kind == "limit"
        assert "max_step_bytes" in recorded.message
        assert await rig.health() == (200, 200)


async def test_healthz_fails_once_the_broker_connection_is_closed_for_good(
    nats_url, topology, sqlite_url
):
    """Provoke the real failure on the gateway's own connection: a message over max_payload
    with its headers, sent through nats-py directly (its check counts the payload alone)."""
    from tokenwire.broker import connect

    own = await connect(nats_url)
    try:
        async with limit_rig(own, topology, nats_url, sqlite_url) as rig:
            assert await rig.health() == (200, 200)
            payload = b"x" * (own.max_payload - 10)
            await own.publish("limits.probe", payload, headers={"k": "v" * 64})
            await eventually(closed(own), timeout_s=10, what="nats-py closing the client")
            assert await rig.health() == (503, 503)
    finally:
        await own.close()
