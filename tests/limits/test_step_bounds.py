"""Step bounds and one truth for caller and store (issue 12, parts 2 and 4), against the real
gateway, a real nats-server, the assembler and a SQLite store, in front of the hostile
upstream. Each test failed before: nothing bounded a step, the output tap kept events that
carried nothing, the caller got a normal end for steps the store recorded as errors.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

import httpx
import pytest

from tests.assembler.harness import eventually
from tests.limits.rig import AUTH, Rig, limit_rig, stream_text
from tokenwire.schemas import Message, RecordedError

pytestmark = pytest.mark.slow


def session() -> str:
    return f"bound-{uuid.uuid4().hex[:10]}"


async def assert_limit(rig: Rig, sid: str, ending: str, bound: str) -> None:
    """The caller was told (an error, no normal end) and the store recorded a limit."""
    assert ending.startswith("error: "), ending
    assert bound in ending
    recorded = await rig.recorded(sid)
    assert isinstance(recorded, RecordedError), recorded
    assert (recorded.kind, bound in recorded.message) == ("limit", True), recorded


def upstream_idle(rig: Rig) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return rig.upstream.open_responses == 0

    return check


async def test_an_endless_step_ends_at_max_step_chunks(nc, topology, nats_url, sqlite_url):
    async with limit_rig(nc, topology, nats_url, sqlite_url, max_step_chunks=300) as rig:
        sid = session()
        text, _, ending = await stream_text(rig.openai(sid), "endless")
        await assert_limit(rig, sid, ending, "max_step_chunks")
        assert text.startswith("w0 w1 ")
        await eventually(upstream_idle(rig), 10, "the gateway to stop reading the provider")


async def test_an_endless_step_ends_at_max_step_seconds(nc, topology, nats_url, sqlite_url):
    async with limit_rig(nc, topology, nats_url, sqlite_url, max_step_seconds=1.0) as rig:
        sid = session()
        _, _, ending = await stream_text(rig.openai(sid), "endless:5")
        await assert_limit(rig, sid, ending, "max_step_seconds")


async def test_keep_alive_bytes_only_end_at_the_idle_bound_not_abandoned(
    nc, topology, nats_url, sqlite_url
):
    """Before: the assembler recorded the step ``abandoned`` while the caller later got a
    normal finish. Now the gateway ends it (idle bound below the abandon timeout) and both
    sides say limit."""
    async with limit_rig(nc, topology, nats_url, sqlite_url, max_step_idle_seconds=1.0) as rig:
        sid = session()
        text, _, ending = await stream_text(rig.openai(sid), "keepalive-only")
        assert text == "hello"
        await assert_limit(rig, sid, ending, "max_step_idle_seconds")


async def test_a_step_whose_caller_left_stops_reading_at_a_bound(
    nc, topology, nats_url, sqlite_url
):
    async with limit_rig(nc, topology, nats_url, sqlite_url, max_step_chunks=2000) as rig:
        sid = session()
        body = {"model": "openai/endless:1", "messages": [{"role": "user", "content": "x"}],
                "stream": True}  # fmt: skip
        async with httpx.AsyncClient(base_url=rig.url, timeout=30) as client:
            headers = {**AUTH, "x-tokenwire-session": sid}
            async with client.stream(
                "POST", "/v1/chat/completions", json=body, headers=headers
            ) as response:
                async for _ in response.aiter_bytes():
                    break  # the caller goes away after its first bytes
        await eventually(upstream_idle(rig), 30, "the gateway to stop reading the provider")
        recorded = await rig.recorded(sid)
        assert isinstance(recorded, RecordedError), recorded
        assert recorded.kind == "limit"
        assert "max_step_chunks" in recorded.message


async def test_events_that_carry_nothing_are_forwarded_not_kept(nc, topology, nats_url, sqlite_url):
    """Before: every event without a chunk stayed in the output tap until the next chunk
    (gigabytes from one stream); the caller saw none of them. Now a read without a chunk
    forwards what it read at once."""
    async with limit_rig(nc, topology, nats_url, sqlite_url, max_step_seconds=3.0) as rig:
        sid = session()
        body = {"model": "openai/empty-events", "stream": True,
                "messages": [{"role": "user", "content": "x"}]}  # fmt: skip
        received = 0
        async with httpx.AsyncClient(base_url=rig.url, timeout=30) as client:
            headers = {**AUTH, "x-tokenwire-session": sid}
            async with client.stream(
                "POST", "/v1/chat/completions", json=body, headers=headers
            ) as response:
                async for data in response.aiter_bytes():
                    received += data.count(b'"choices":[]')
                    if received >= 10_000:
                        break
        assert received >= 10_000


async def test_chunks_after_done_reach_neither_the_caller_nor_the_store(
    nc, topology, nats_url, sqlite_url
):
    async with limit_rig(nc, topology, nats_url, sqlite_url) as rig:
        sid = session()
        text, _, ending = await stream_text(rig.openai(sid), "after-done")
        assert (text, ending) == ("before", "stop")
        recorded = await rig.recorded(sid)
        assert isinstance(recorded, Message), recorded
        assert recorded.text == text


async def test_more_open_blocks_than_the_fold_allows_is_an_error_for_both(
    nc, topology, nats_url, sqlite_url
):
    """Before: the store recorded a ``limit`` error while the caller got a normal stream
    ending in ``[DONE]``."""
    async with limit_rig(nc, topology, nats_url, sqlite_url) as rig:
        sid = session()
        _, _, ending = await stream_text(rig.openai(sid), "many-open-calls:70")
        await assert_limit(rig, sid, ending, "max_open_blocks")
        ok = session()
        _, _, fine = await stream_text(rig.openai(ok), "many-open-calls:8")
        assert fine == "tool_calls"
        assert isinstance(await rig.recorded(ok), Message)
