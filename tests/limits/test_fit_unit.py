"""Fitting chunks into broker messages, and the fold of a by-reference block-end (units)."""

from __future__ import annotations

import pytest

from tokenwire.fold import fold
from tokenwire.schemas import (
    BlockEnd,
    Finish,
    ImageBlock,
    Message,
    ReasoningBlock,
    ReasoningDelta,
    StreamChunk,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallDelta,
    json_encoder,
)
from tokenwire.services.gateway._steps.fit import ChunkTooLarge, DeltaLedger, fitted


def under(limit: int):
    return lambda chunk: len(json_encoder.encode(chunk)) <= limit


def publish(chunks: list[StreamChunk], limit: int) -> list[StreamChunk]:
    """What the gateway publishes for ``chunks`` with messages of ``limit`` bytes."""
    ledger, out = DeltaLedger(), []
    for chunk in chunks:
        out += fitted(chunk, under(limit), ledger)
        ledger.note(chunk)
    return out


def test_a_large_delta_splits_into_fitting_deltas_that_fold_to_the_same_text() -> None:
    text = 'é"x\\' * 5000  # escaping and UTF-8 make the encoded size larger than len()
    chunks: list[StreamChunk] = [TextDelta(0, text), BlockEnd(0, TextBlock(text)), Finish("stop")]
    published = publish(chunks, 4096)
    assert all(len(json_encoder.encode(c)) <= 4096 for c in published)
    assert len(published) > 3
    ends = [c for c in published if isinstance(c, BlockEnd)]
    assert ends == [BlockEnd(0, TextBlock(""), by_reference=True)]
    assert fold(published) == fold(chunks)


def test_tool_call_and_reasoning_go_by_reference_keeping_their_other_fields() -> None:
    args = '{"v": "' + "q" * 9000 + '"}'
    chunks: list[StreamChunk] = [
        ReasoningDelta(0, "r" * 9000),
        BlockEnd(0, ReasoningBlock("r" * 9000, signature="sig")),
        ToolCallDelta(1, "call_1", "put", args[:10]),
        ToolCallDelta(1, "call_1", None, args[10:]),
        BlockEnd(1, ToolCallBlock("call_1", "put", args)),
        Finish("tool-calls"),
    ]
    published = publish(chunks, 4096)
    assert BlockEnd(0, ReasoningBlock("", "sig"), by_reference=True) in published
    assert BlockEnd(1, ToolCallBlock("call_1", "put", ""), by_reference=True) in published
    assert fold(published) == fold(chunks)


def test_a_block_end_that_differs_from_its_deltas_is_not_sent_by_reference() -> None:
    ledger = DeltaLedger()
    ledger.note(TextDelta(0, "a" * 9000))
    with pytest.raises(ChunkTooLarge, match="differs"):
        fitted(BlockEnd(0, TextBlock("b" * 9000)), under(4096), ledger)


def test_a_block_kind_that_never_streams_cannot_be_fitted() -> None:
    with pytest.raises(ChunkTooLarge, match="image"):
        fitted(BlockEnd(0, ImageBlock("image/png", data="A" * 9000)), under(4096), DeltaLedger())


def test_old_payloads_without_by_reference_fold_as_before() -> None:
    chunks: list[StreamChunk] = [
        TextDelta(0, "hi"),
        BlockEnd(0, TextBlock("hello")),
        Finish("stop"),
    ]
    folded = fold(chunks)
    assert isinstance(folded, Message)
    assert folded.text == "hello"  # the block-end's own content stays authoritative
