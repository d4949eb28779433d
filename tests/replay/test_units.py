"""Unit tests of one piece each: the renderer, the SSE client queue and coalescing."""

from __future__ import annotations

import asyncio

from tests.replay.sessions import queued_event
from tokenwire.replay import (
    ClientQueue,
    ReplayEvent,
    SessionRenderer,
    ShownError,
    ShownFinish,
    ShownReasoning,
    ShownStepStart,
    ShownText,
    ShownToolCall,
    SlowReaderPolicy,
    SseStats,
    coalesce,
)
from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    ChunkEnvelope,
    Finish,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallBlock,
    ToolCallDelta,
    Usage,
)


def env(ordinal: int, chunk, turn: int = 0, step: int = 0) -> ChunkEnvelope:
    return ChunkEnvelope("s", turn, step, ordinal, 1_000 + ordinal, "p", "m", chunk)


def test_a_delta_only_tool_call_shows_at_the_finish_never_before():
    r = SessionRenderer()
    shown = [
        r.render(env(0, ToolCallDelta(0, "c1", "f", '{"a"'))),
        r.render(env(1, ToolCallDelta(0, "c1", None, ": 1}"))),
        r.render(env(2, Finish("tool-calls"))),
    ]
    assert shown[0] == (ShownStepStart(None),)
    assert shown[1] == ()
    assert shown[2] == (
        ShownToolCall(ToolCallBlock("c1", "f", '{"a": 1}')),
        ShownFinish("tool-calls"),
    )


def test_a_text_block_that_only_came_as_block_end_is_shown_then():
    r = SessionRenderer()
    r.render(env(0, BlockStart(0, "text")))
    assert r.render(env(1, BlockEnd(0, TextBlock("whole")))) == (ShownText(0, "whole"),)
    r2 = SessionRenderer()
    r2.render(env(0, TextDelta(0, "stream")))
    assert r2.render(env(1, BlockEnd(0, TextBlock("stream")))) == ()  # already shown


def test_a_chunk_waits_for_the_one_before_it_and_duplicates_show_nothing():
    r = SessionRenderer()
    assert r.render(env(0, TextDelta(0, "a"))) == (ShownStepStart(None), ShownText(0, "a"))
    assert r.render(env(2, TextDelta(0, "c"))) == ()
    assert r.render(env(1, TextDelta(0, "b"))) == (ShownText(0, "b"), ShownText(0, "c"))
    assert r.render(env(1, TextDelta(0, "b"))) == ()
    assert r.render(env(3, Finish("stop"))) == (ShownFinish("stop"),)
    assert r.render(env(3, Finish("stop"))) == ()  # a finished step stays finished
    assert r.unfinished() == []


def test_aborted_and_contract_breaks_show_as_errors():
    r = SessionRenderer()
    r.render(env(0, TextDelta(0, "x")))
    [end] = r.render(env(1, Finish("aborted")))
    assert isinstance(end, ShownError)
    assert end.error.kind == "aborted"
    r.render(env(0, ToolCallDelta(0, "c", "f", "{"), step=1))
    r.render(env(1, TextDelta(0, "oops"), step=1))  # a text delta into a tool-call block
    [end] = r.render(env(2, Finish("stop"), step=1))
    assert isinstance(end, ShownError)
    assert end.error.kind == "contract"


def test_open_steps_are_bounded():
    r = SessionRenderer(max_open_steps=2)
    for step in range(3):
        r.render(env(0, TextDelta(0, "x"), step=step))
    assert r.unfinished() == [(0, 1), (0, 2)]


def event(seq: int, chunk, step: int = 0, shown=()) -> ReplayEvent:
    return ReplayEvent(seq, env(seq, chunk, step=step), tuple(shown))


def test_coalescing_keeps_the_text_and_advances_the_id():
    a = event(5, TextDelta(0, "Hel"), shown=[ShownText(0, "Hel")])
    b = event(6, TextDelta(0, "lo"), shown=[ShownText(0, "lo")])
    merged = coalesce(a, b, 100)
    assert merged is not None
    assert merged.seq == 6
    assert merged.coalesced == 1
    assert merged.shown == (ShownText(0, "Hello"),)
    assert merged.envelope.chunk == TextDelta(0, "Hello")
    invisible = event(7, Usage(TokenUsage(output_tokens=3)))
    absorbed = coalesce(merged, invisible, 100)
    assert absorbed is not None
    assert absorbed.seq == 7
    assert coalesce(a, b, 4) is None  # past the merged-text bound
    assert coalesce(a, event(6, TextDelta(1, "x"), shown=[ShownText(1, "x")]), 100) is None
    assert coalesce(a, event(6, TextDelta(0, "x"), shown=[ShownReasoning(0, "x")]), 100) is None
    assert coalesce(a, event(6, Finish("stop"), shown=[ShownFinish("stop")]), 100) is None


async def test_the_client_queue_never_waits_and_reports_lag():
    stats = SseStats()
    queue = ClientQueue(SlowReaderPolicy(queue_bound=2), start=(1, 0), stats=stats)
    text = [event(i, TextDelta(0, "x"), shown=[ShownText(0, "x")]) for i in (1, 2, 3)]
    assert all(queue.offer(e) for e in text)  # the third merged into the second
    assert stats.coalesced == 1
    assert queue.resume == (4, 0)
    assert not queue.offer(event(4, Finish("stop"), shown=[ShownFinish("stop")]))
    assert queue.resume == (4, 0)
    assert not await queue.drained(0.01)  # nobody reads
    queue.lag()
    first = await queue.take(0.01)
    second = await queue.take(0.01)
    assert isinstance(first, bytes)
    assert isinstance(second, bytes)
    a, b = queued_event(first), queued_event(second)
    assert (a.seq, b.seq, b.coalesced) == (1, 3, 1)
    assert b.shown == (ShownText(0, "xx"),)
    signal = await queue.take(0.01)
    assert not isinstance(signal, bytes)
    assert signal.value == "lagged"


def test_merged_text_is_bounded_in_bytes_whatever_its_characters():
    """Non-ASCII text counts 4 bytes a character (its most in UTF-8 and in CPython), so
    emoji merge 4 times fewer characters than ASCII under the same bound."""
    ascii_a = event(5, TextDelta(0, "abcd"), shown=[ShownText(0, "abcd")])
    ascii_b = event(6, TextDelta(0, "efgh"), shown=[ShownText(0, "efgh")])
    assert coalesce(ascii_a, ascii_b, 8) is not None
    emoji_a = event(5, TextDelta(0, "\U0001f600"), shown=[ShownText(0, "\U0001f600")])
    emoji_b = event(6, TextDelta(0, "\U0001f680"), shown=[ShownText(0, "\U0001f680")])
    assert coalesce(emoji_a, emoji_b, 8) is not None  # 2 characters, 8 bytes
    assert coalesce(emoji_a, emoji_b, 7) is None
    latin = event(6, TextDelta(0, "caf\u00e9"), shown=[ShownText(0, "caf\u00e9")])
    assert coalesce(ascii_a, latin, 31) is None  # the merged string is not ASCII: 8 x 4
    assert coalesce(ascii_a, latin, 32) is not None


async def test_the_client_queue_is_bounded_in_bytes_not_only_in_events():
    """Events of long text fill the queue by its byte bound long before its event bound; past
    it they merge into the last one (up to the merge bound), then the read must pause."""
    stats = SseStats()
    policy = SlowReaderPolicy(queue_bound=1000, queue_bytes=8 * 1024, max_coalesced_bytes=4096)
    queue = ClientQueue(policy, start=(1, 0), stats=stats)
    text = "\u6f22\u5b57" * 250  # 500 characters of CJK: counted 2,000 bytes
    offered = 0
    while queue.offer(event(offered + 1, TextDelta(0, text), shown=[ShownText(0, text)])):
        offered += 1
    assert stats.coalesced == 1  # 2,000 + 2,000 bytes fit the merge bound once
    frames: list[bytes] = []
    queue.end()
    while isinstance(item := await queue.take(0.01), bytes):
        frames.append(item)
    assert sum(len(f) for f in frames[:-1]) < 8 * 1024 + len(frames[-2])
    assert len(frames) < 10
    shown = [queued_event(f) for f in frames]
    assert sum(1 + e.coalesced for e in shown) == offered
    assert "".join(s.text for e in shown for s in e.shown if isinstance(s, ShownText)) == (
        text * offered
    )


async def test_a_drained_queue_lets_the_read_resume():
    queue = ClientQueue(SlowReaderPolicy(queue_bound=2), start=(1, 0), stats=SseStats())
    finish = [event(i, Finish("stop"), step=i, shown=[ShownFinish("stop")]) for i in (1, 2)]
    for e in finish:
        queue.offer(e)

    async def reader():
        await asyncio.sleep(0.01)
        return await queue.take(1)

    task = asyncio.create_task(reader())
    assert await queue.drained(5)
    first = await task
    assert isinstance(first, bytes)
    assert queued_event(first).seq == 1
