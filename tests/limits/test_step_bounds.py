"""Step bounds and one truth for caller and store (issue 12, parts 2 and 4), against the real
gateway, a real nats-server, the assembler and a SQLite store, in front of the hostile
upstream. Each test failed before: nothing bounded a step, the output tap kept events that
carried nothing, the caller got a normal end for steps the store recorded as errors.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import anthropic
import httpx
import openai
import pytest

from tests.assembler.harness import eventually
from tests.gateway._helpers import GATEWAY_KEY
from tests.limits import hostile
from tests.limits.rig import AUTH, Rig, limit_rig, stream_text
from tokenwire.replay import stored_chunks
from tokenwire.schemas import Message, RecordedError, TextDelta, chunk_envelopes

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
        body = {
            "model": "openai/endless:1",
            "messages": [{"role": "user", "content": "x"}],
            "stream": True,
        }
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
    forwards what it read at once.

    The upstream sends empty events until the caller has counted 10,000 of them, and only
    then a normal end: a gateway that kept them would show the caller none until the step
    bound ends the stream (then the count fails). However slowly the machine runs, the count
    is reached or not, whatever the time it takes."""
    counted = asyncio.Event()

    async def empty_until_counted() -> AsyncIterator[bytes]:
        yield hostile.event({"role": "assistant", "content": "hello"})
        while not counted.is_set():
            yield hostile.EMPTY * 64
            await asyncio.sleep(0.001)
        yield hostile.event({}, "stop") + hostile.DONE

    extra = {"empty-until-counted": empty_until_counted}
    async with limit_rig(nc, topology, nats_url, sqlite_url, extra, max_step_seconds=60.0) as rig:
        sid = session()
        body = {
            "model": "openai/empty-until-counted",
            "stream": True,
            "messages": [{"role": "user", "content": "x"}],
        }
        received = 0
        async with httpx.AsyncClient(base_url=rig.url, timeout=30) as client:
            headers = {**AUTH, "x-tokenwire-session": sid}
            async with client.stream(
                "POST", "/v1/chat/completions", json=body, headers=headers
            ) as response:
                async for data in response.aiter_bytes():
                    received += data.count(b'"choices":[]')
                    if received >= 10_000:
                        counted.set()
                tail = data
        assert received >= 10_000
        assert tail.endswith(b"data: [DONE]\n\n"), tail[-200:]


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


async def logged_text(rig: Rig, sid: str) -> str:
    """The text of the session's chunk log, as the broker retains it."""
    text = ""
    async for batch in stored_chunks(rig.nc, rig.topology, sid):
        for _, payload in batch:
            for envelope in chunk_envelopes(payload):
                chunk = envelope.chunk
                text += chunk.text if isinstance(chunk, TextDelta) else ""
    return text


def burst_after(started: asyncio.Event) -> hostile.Scenario:
    """One delta; once ``started`` is set, 400 deltas in one write; then keep-alive bytes."""

    async def burst(count: str = "400") -> AsyncIterator[bytes]:
        yield hostile.event({"role": "assistant", "content": "hello "})
        await asyncio.wait_for(started.wait(), 30)  # the caller has the first read's bytes
        yield b"".join(hostile.event({"content": f"t{i} "}) for i in range(int(count)))
        while True:  # keep the response open; the gateway leaves at the bound
            await asyncio.sleep(0.05)
            yield b": keep-alive\n\n"

    return burst


async def openai_caller(rig: Rig, sid: str, started: asyncio.Event) -> tuple[str, str]:
    """Same dialect as the provider: the provider's events forwarded."""
    client, text, ending = rig.openai(sid), "", ""
    try:
        stream = await client.chat.completions.create(
            model="openai/burst", stream=True, messages=[{"role": "user", "content": "x"}]
        )
        async for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
            started.set()
    except openai.APIError as exc:
        ending = f"error: {exc.message}"
    finally:
        await client.close()
    return text, ending


async def anthropic_caller(rig: Rig, sid: str, started: asyncio.Event) -> tuple[str, str]:
    """Another dialect: every chunk encoded as an Anthropic event."""
    text, ending = "", ""
    async with anthropic.AsyncAnthropic(
        base_url=rig.url,
        api_key=GATEWAY_KEY,
        max_retries=0,
        timeout=120,
        default_headers={"X-Tokenwire-Session": sid},
    ) as client:
        try:
            async with client.messages.stream(
                model="openai/burst", max_tokens=64, messages=[{"role": "user", "content": "x"}]
            ) as stream:
                async for event in stream:
                    if event.type == "content_block_delta" and event.delta.type == "text_delta":
                        text += event.delta.text
                    started.set()
        except anthropic.APIError as exc:
            ending = f"error: {exc.message}"
    return text, ending


@pytest.mark.parametrize("caller", [openai_caller, anthropic_caller], ids=["forwarded", "encoded"])
async def test_a_bound_inside_one_read_leaves_the_caller_and_the_log_equal(
    caller, nc, topology, nats_url, sqlite_url
):
    """The stream starts, then one provider write carries 400 deltas and the chunk bound
    falls among them. Before, the events of that read already published never reached the
    caller (the log held ~200 words the caller never saw); now the caller gets exactly the
    events whose chunks were published, then the error."""
    started = asyncio.Event()
    async with limit_rig(
        nc,
        topology,
        nats_url,
        sqlite_url,
        extra={"burst": burst_after(started)},
        max_step_chunks=200,
    ) as rig:
        sid = session()
        text, ending = await caller(rig, sid, started)
        await assert_limit(rig, sid, ending, "max_step_chunks")
        assert text.startswith("hello t0 t1 ")
        assert text == await logged_text(rig, sid)


def _call(delta: dict[str, object]) -> bytes:
    return hostile.event({"tool_calls": [{"index": 0, **delta}]})


async def nameless_call() -> AsyncIterator[bytes]:
    """A tool call that never gets a name: the fold's contract error, found at the finish."""
    yield hostile.event({"role": "assistant"})
    yield _call({"id": "call_0", "type": "function", "function": {"arguments": '{"a": 1}'}})
    yield hostile.event({}, "tool_calls") + hostile.USAGE + hostile.DONE


async def test_a_stream_the_fold_calls_broken_is_an_error_for_both(
    nc, topology, nats_url, sqlite_url
):
    """Before, the caller got a normal end (finish_reason tool_calls, then [DONE]) while the
    store recorded the fold's contract error; now both get the fold's error."""
    extra = {"nameless-call": nameless_call}
    async with limit_rig(nc, topology, nats_url, sqlite_url, extra=extra) as rig:
        sid = session()
        _, _, ending = await stream_text(rig.openai(sid), "nameless-call")
        recorded = await rig.recorded(sid)
        assert isinstance(recorded, RecordedError), recorded
        assert recorded.kind == "contract"
        assert ending.startswith("error: "), ending
        assert recorded.message in ending
