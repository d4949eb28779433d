"""Recorded payloads of wire schema version 1 decode, every run, to exactly these values.

The JSON files under samples/v1/ are hand-written documents in the version-1 encoding; they
never change. If a schema change breaks one of them, the change is not additive (PRINCIPLES 4).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    ChunkEnvelope,
    ChunkEvent,
    ErrorEvent,
    Finish,
    ImageBlock,
    Message,
    MessageEvent,
    ReasoningBlock,
    ReasoningDelta,
    RecordedError,
    StepError,
    StepPersisted,
    StreamChunk,
    StreamStarted,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallBlock,
    ToolCallDelta,
    ToolResultBlock,
    Usage,
    chunk_decoder,
    envelope_decoder,
    event_decoder,
)

SAMPLES = Path(__file__).parent / "samples" / "v1"
T0 = 1767225600000000000


def envelope(ordinal: int, chunk: StreamChunk, request_time_ns: int | None = None) -> ChunkEnvelope:
    return ChunkEnvelope(
        session="sess-1",
        turn=2,
        step=0,
        ordinal=ordinal,
        time_ns=T0,
        provider="anthropic",
        model="claude-sonnet-4-5",
        chunk=chunk,
        v=1,
        request_time_ns=request_time_ns,
    )


ENVELOPES: dict[str, ChunkEnvelope] = {
    "envelope-block-start.json": envelope(
        0, BlockStart(index=0, block_type="reasoning"), request_time_ns=T0 - 500_000_000
    ),
    "envelope-text-delta.json": envelope(5, TextDelta(index=1, text="Hello, wörld ✓")),
    "envelope-reasoning-delta.json": envelope(1, ReasoningDelta(index=0, text="Let me think")),
    "envelope-tool-call-delta-first.json": envelope(
        7, ToolCallDelta(index=2, id="toolu_01", name="get_weather", arguments_delta='{"ci')
    ),
    "envelope-tool-call-delta-next.json": envelope(
        8, ToolCallDelta(index=2, id="", name=None, arguments_delta="")
    ),
    "envelope-block-end-text.json": envelope(
        6, BlockEnd(index=1, block=TextBlock(text="Hello, wörld ✓"))
    ),
    "envelope-block-end-tool-call-by-reference.json": envelope(
        9,
        BlockEnd(
            index=2,
            block=ToolCallBlock(id="toolu_01", name="get_weather", arguments=""),
            by_reference=True,
        ),
    ),
    "envelope-block-end-reasoning.json": envelope(
        2,
        BlockEnd(
            index=0,
            block=ReasoningBlock(text="Let me think", signature="EqQBCgIYAhIM", redacted=None),
        ),
    ),
    "envelope-block-end-reasoning-redacted.json": envelope(
        3, BlockEnd(index=3, block=ReasoningBlock(text="", signature=None, redacted="opaque-b64=="))
    ),
    "envelope-block-end-tool-call.json": envelope(
        9,
        BlockEnd(
            index=2,
            block=ToolCallBlock(id="toolu_01", name="get_weather", arguments='{"city": "Oslo"}'),
        ),
    ),
    "envelope-block-end-tool-result.json": envelope(
        10,
        BlockEnd(
            index=4, block=ToolResultBlock(tool_call_id="toolu_01", content="12 °C", is_error=False)
        ),
    ),
    "envelope-block-end-image.json": envelope(
        11,
        BlockEnd(index=5, block=ImageBlock(media_type="image/png", data="iVBORw0KGgo=", url=None)),
    ),
    "envelope-usage.json": envelope(
        12,
        Usage(
            usage=TokenUsage(
                input_tokens=100,
                output_tokens=40,
                cache_read_tokens=2048,
                cache_write_tokens=None,
                reasoning_tokens=12,
            )
        ),
    ),
    "envelope-finish-tool-calls.json": envelope(
        13,
        Finish(
            reason="tool-calls",
            error=None,
            replay_state={"response_id": "msg_01", "encrypted": ["a", 1]},
        ),
    ),
    "envelope-finish-error.json": envelope(
        4,
        Finish(
            reason="error",
            error=StepError(message="Overloaded", retryable=True, code="overloaded_error"),
            replay_state=None,
        ),
    ),
}

EVENTS: dict[str, Any] = {
    "event-chunk.json": ChunkEvent(
        seq=42,
        envelope=ChunkEnvelope(
            session="sess-1",
            turn=0,
            step=1,
            ordinal=0,
            time_ns=T0,
            provider="openai",
            model="gpt-4o",
            chunk=TextDelta(index=0, text="Hi"),
            v=1,
            request_time_ns=T0 - 1_000_000_000,
        ),
    ),
    "event-message.json": MessageEvent(
        session="sess-1",
        turn=0,
        step=1,
        seq_start=42,
        seq_end=57,
        provider="openai",
        model="gpt-4o",
        message=Message(
            content=[
                ReasoningBlock(text="plan", signature="sig"),
                TextBlock(text="Checking."),
                ToolCallBlock(id="call_1", name="search", arguments='{"q": "tokenwire"}'),
                ToolResultBlock(tool_call_id="call_1", content="no results", is_error=True),
                ImageBlock(media_type="image/jpeg", data=None, url="https://example.com/a.jpg"),
            ],
            finish_reason="max-tokens",
            role="assistant",
            usage=TokenUsage(input_tokens=10, output_tokens=20),
            replay_state={"response_id": "resp_1"},
            dropped_tool_calls=[ToolCallBlock(id="call_2", name="fetch", arguments='{"url": "ht')],
            ignored_deltas=3,
        ),
    ),
    "event-error.json": ErrorEvent(
        session="sess-1",
        turn=1,
        step=0,
        seq_start=58,
        seq_end=60,
        provider="anthropic",
        model="claude-sonnet-4-5",
        error=RecordedError(
            kind="provider",
            message="Overloaded",
            retryable=True,
            code="overloaded_error",
            usage=TokenUsage(input_tokens=7),
        ),
    ),
}

OTHERS: dict[str, tuple[type, Any]] = {
    "message.json": (
        Message,
        Message(
            content=[TextBlock(text="Hello")],
            finish_reason="stop",
            role="assistant",
            usage=None,
            replay_state=None,
            dropped_tool_calls=[],
            ignored_deltas=0,
        ),
    ),
    "recorded-error.json": (
        RecordedError,
        RecordedError(
            kind="limit",
            message="step exceeded max_step_bytes: 16777217 bytes, limit 16777216",
            retryable=False,
            code=None,
            usage=None,
        ),
    ),
    "step-persisted.json": (
        StepPersisted,
        StepPersisted(
            session="sess-1", turn=0, step=1, outcome="message", seq_start=42, seq_end=57, v=1
        ),
    ),
    "stream-started.json": (
        StreamStarted,
        StreamStarted(
            session="sess-1",
            turn=0,
            step=1,
            provider="openai",
            model="gpt-4o",
            first_chunk_time_ns=T0,
            first_block_type="text",
            request_time_ns=T0 - 1_000_000_000,
            time_to_first_chunk_s=1.0,
            traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            v=1,
        ),
    ),
}

CHUNKS_JSONL: list[StreamChunk] = [
    BlockStart(index=0, block_type="text"),
    TextDelta(index=0, text="Hi"),
    BlockEnd(index=0, block=TextBlock(text="Hi")),
    ReasoningDelta(index=1, text="hm"),
    ToolCallDelta(index=2, id="call_9", name="f", arguments_delta="{}"),
    Usage(usage=TokenUsage(output_tokens=3)),
    Finish(reason="stop"),
]


def _assert_same(decoded: Any, expected: Any) -> None:
    """Field by field (recursively), so a failure names the field that changed."""
    assert type(decoded) is type(expected)
    if isinstance(expected, msgspec.Struct):
        for name in expected.__struct_fields__:
            _assert_same(getattr(decoded, name), getattr(expected, name))
    elif isinstance(expected, list):
        assert len(decoded) == len(expected)
        for d, e in zip(decoded, expected, strict=True):
            _assert_same(d, e)
    else:
        assert decoded == expected


def _read(name: str) -> bytes:
    return (SAMPLES / name).read_bytes()


@pytest.mark.parametrize("name", sorted(ENVELOPES))
def test_envelope_samples_decode(name: str) -> None:
    _assert_same(envelope_decoder.decode(_read(name)), ENVELOPES[name])


@pytest.mark.parametrize("name", sorted(EVENTS))
def test_session_event_samples_decode(name: str) -> None:
    _assert_same(event_decoder.decode(_read(name)), EVENTS[name])


@pytest.mark.parametrize("name", sorted(OTHERS))
def test_other_samples_decode(name: str) -> None:
    tp, expected = OTHERS[name]
    _assert_same(msgspec.json.decode(_read(name), type=tp), expected)


def test_chunk_lines_decode() -> None:
    lines = _read("chunks.jsonl").splitlines()
    _assert_same([chunk_decoder.decode(line) for line in lines], CHUNKS_JSONL)


def test_every_sample_has_an_expectation() -> None:
    on_disk = {p.name for p in SAMPLES.iterdir()}
    assert on_disk == {*ENVELOPES, *EVENTS, *OTHERS, "chunks.jsonl"}


def test_the_samples_cover_every_variant() -> None:
    chunk_types = {type(e.chunk) for e in ENVELOPES.values()}
    assert chunk_types == set(StreamChunk.__args__)
    block_types = {type(e.chunk.block) for e in ENVELOPES.values() if isinstance(e.chunk, BlockEnd)}
    assert block_types == {TextBlock, ReasoningBlock, ToolCallBlock, ToolResultBlock, ImageBlock}
    assert {type(e) for e in EVENTS.values()} == {ChunkEvent, MessageEvent, ErrorEvent}
