"""Small builders of step records for the store tests (deterministic, no randomness)."""

from __future__ import annotations

import msgspec

from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    ChunkEnvelope,
    Finish,
    Message,
    RecordedError,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
    Usage,
)
from tokenwire.store import StepRecord

BASE_NS = 1_750_000_000_000_000_000


def text_chunks(session: str, turn: int, step: int, n: int) -> list[ChunkEnvelope]:
    """``n`` envelopes of one step: text deltas ``"<session>/<turn>/<step>#<i>"``."""
    return [
        envelope(session, turn, step, i, TextDelta(index=0, text=f"{session}/{turn}/{step}#{i}"))
        for i in range(n)
    ]


def envelope(session: str, turn: int, step: int, ordinal: int, chunk: StreamChunk) -> ChunkEnvelope:
    """One envelope, its time 1 ms per (turn, step, ordinal) after BASE_NS."""
    return ChunkEnvelope(
        session=session,
        turn=turn,
        step=step,
        ordinal=ordinal,
        time_ns=BASE_NS + (turn * 1000 + step * 100 + ordinal) * 1_000_000,
        provider="openai",
        model="gpt-4o-mini",
        chunk=chunk,
    )


def message_record(
    session: str, turn: int, step: int, n: int, *, text: str = "hello", completed_ns: int = 0
) -> StepRecord:
    """A completed step of ``n`` text chunks whose message says ``text``."""
    return StepRecord(
        session=session,
        turn=turn,
        step=step,
        provider="openai",
        model="gpt-4o-mini",
        chunks=text_chunks(session, turn, step, n),
        outcome=Message(content=[TextBlock(text=text)], finish_reason="stop"),
        completed_ns=completed_ns or BASE_NS + (turn * 1000 + step * 100 + 99) * 1_000_000,
    )


def error_record(
    session: str, turn: int, step: int, n: int, *, completed_ns: int = 0
) -> StepRecord:
    """A failed step of ``n`` text chunks with a provider error."""
    return StepRecord(
        session=session,
        turn=turn,
        step=step,
        provider="anthropic",
        model="claude-sonnet-4-5",
        chunks=text_chunks(session, turn, step, n),
        outcome=RecordedError(kind="provider", message="overloaded", retryable=True),
        completed_ns=completed_ns or BASE_NS + (turn * 1000 + step * 100 + 99) * 1_000_000,
    )


def full_step_chunks(session: str) -> list[ChunkEnvelope]:
    """One of several chunk shapes (ordinals 0..4); ordinal 0 carries ``request_time_ns``."""
    chunks: list[StreamChunk] = [
        BlockStart(index=0, block_type="text"),
        TextDelta(index=0, text="héllo \u0000 wörld"),
        BlockEnd(index=0, block=TextBlock(text="héllo \u0000 wörld")),
        Usage(usage=TokenUsage(input_tokens=10, output_tokens=3, cache_read_tokens=4)),
        Finish(reason="stop", replay_state={"response_id": "resp_1", "n": [1, 2]}),
    ]
    out = [envelope(session, 0, 0, i, c) for i, c in enumerate(chunks)]
    out[0] = msgspec.structs.replace(out[0], request_time_ns=out[0].time_ns - 250_000_000)
    return out
