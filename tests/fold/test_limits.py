"""Bounds: exceeding one ends the step as RecordedError(kind="limit") and stops accumulating."""

from __future__ import annotations

import pytest

from tokenwire.fold import FoldLimits, StepFold, fold
from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    Finish,
    Message,
    RecordedError,
    StepError,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallDelta,
    Usage,
)


def test_limits_reject_nonsense() -> None:
    with pytest.raises(ValueError, match="max_step_bytes"):
        FoldLimits(max_step_bytes=0)


def test_text_up_to_the_byte_limit_is_kept() -> None:
    result = fold(
        [TextDelta(index=0, text="x" * 10), Finish(reason="stop")], FoldLimits(max_step_bytes=10)
    )
    assert isinstance(result, Message)


def test_bytes_are_counted_in_utf8() -> None:
    # "é" is 2 bytes in UTF-8: five of them are 10 bytes, six exceed a 10-byte bound.
    limits = FoldLimits(max_step_bytes=10)
    assert isinstance(
        fold([TextDelta(index=0, text="é" * 5), Finish(reason="stop")], limits), Message
    )
    result = fold([TextDelta(index=0, text="é" * 6), Finish(reason="stop")], limits)
    assert result == RecordedError("limit", "step exceeded max_step_bytes: 12 bytes, limit 10")


@pytest.mark.parametrize(
    "chunks",
    [
        [TextDelta(index=0, text="x" * 6), TextDelta(index=1, text="y" * 5)],
        [ToolCallDelta(index=0, id="c", name="f", arguments_delta="{" * 10)],
        [BlockEnd(index=0, block=TextBlock("z" * 11))],
    ],
)
def test_text_arguments_and_ended_blocks_all_count_toward_the_byte_limit(chunks) -> None:
    result = fold([*chunks, Finish(reason="stop")], FoldLimits(max_step_bytes=10))
    assert isinstance(result, RecordedError)
    assert result.kind == "limit"
    assert "max_step_bytes" in result.message
    assert "limit 10" in result.message


def test_a_block_end_replaces_its_deltas_in_the_byte_count() -> None:
    # The deltas and the block-end carry the same 8 bytes: counted once, not twice.
    chunks: list[StreamChunk] = [
        TextDelta(index=0, text="abcd"),
        TextDelta(index=0, text="efgh"),
        BlockEnd(index=0, block=TextBlock("abcdefgh")),
        Finish(reason="stop"),
    ]
    assert fold(chunks, FoldLimits(max_step_bytes=8)) == Message(
        content=[TextBlock("abcdefgh")], finish_reason="stop"
    )


def test_too_many_open_blocks() -> None:
    chunks = [TextDelta(index=i, text="a") for i in range(3)]
    result = fold([*chunks, Finish(reason="stop")], FoldLimits(max_open_blocks=2))
    assert result == RecordedError(
        "limit", "step exceeded max_open_blocks: block 2 would be open block 3, limit 2"
    )


def test_ended_blocks_free_their_open_slot_but_count_toward_max_blocks() -> None:
    chunks: list[StreamChunk] = []
    for i in range(4):
        chunks += [BlockStart(index=i, block_type="text"), BlockEnd(index=i, block=TextBlock(""))]
    limits = FoldLimits(max_open_blocks=1, max_blocks=3)
    result = fold([*chunks, Finish(reason="stop")], limits)
    assert result == RecordedError(
        "limit", "step exceeded max_blocks: block 3 would be block 4, limit 3"
    )


def test_after_a_limit_the_fold_keeps_nothing_but_still_waits_for_finish_and_usage() -> None:
    usage = TokenUsage(output_tokens=99)
    step = StepFold(FoldLimits(max_step_bytes=4))
    step.feed(TextDelta(index=0, text="12345"))
    assert step.snapshot() == []
    assert not step.finished
    for _ in range(1000):
        step.feed(TextDelta(index=0, text="more text that is not kept"))
    step.feed(Usage(usage))
    # The first cause wins over a later provider error.
    step.feed(Finish(reason="error", error=StepError("boom")))
    assert step.result() == RecordedError(
        "limit", "step exceeded max_step_bytes: 5 bytes, limit 4", usage=usage
    )


def test_fail_after_a_limit_records_the_limit() -> None:
    step = StepFold(FoldLimits(max_open_blocks=1))
    step.feed(TextDelta(index=0, text="a"))
    step.feed(TextDelta(index=1, text="b"))
    error = step.fail("abandoned", "no finish in time")
    assert error.kind == "limit"
    assert "max_open_blocks" in error.message
