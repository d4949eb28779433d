"""StepCollector: reassembly by ordinal, independent of delivery order, within a bounded window."""

from __future__ import annotations

import pytest

from tokenwire.fold import (
    Added,
    FoldLimits,
    InvalidOrdinal,
    ReorderWindowError,
    StepCollector,
    StepStateError,
)
from tokenwire.schemas import (
    Finish,
    Message,
    RecordedError,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
    Usage,
)

A, B, C = (TextDelta(index=0, text=t) for t in "abc")
STOP = Finish(reason="stop")


def test_in_order_chunks_are_accepted_and_complete_the_step() -> None:
    c = StepCollector()
    chunks: list[StreamChunk] = [A, B, STOP]
    assert [c.add(i, ch) for i, ch in enumerate(chunks)] == [Added.ACCEPTED] * 3
    assert c.complete
    assert c.missing() == []
    assert c.result() == Message(content=[TextBlock("ab")], finish_reason="stop")


def test_out_of_order_chunks_wait_for_the_gap_and_are_then_fed_in_order() -> None:
    c = StepCollector()
    assert c.add(2, C) is Added.BUFFERED
    assert c.add(4, STOP) is Added.BUFFERED
    assert c.missing() == [0, 1, 3]
    assert c.fold.snapshot() == []
    assert c.add(0, A) is Added.ACCEPTED
    assert c.fold.snapshot() == [TextBlock("a")]
    assert (c.missing(), c.buffered, c.next_ordinal) == ([1, 3], 2, 1)
    assert c.add(1, B) is Added.ACCEPTED
    assert (c.missing(), c.complete) == ([3], False)
    with pytest.raises(StepStateError):
        c.result()
    assert c.add(3, TextDelta(index=0, text="d")) is Added.ACCEPTED
    assert c.complete
    assert c.buffered == 0
    assert c.result() == Message(content=[TextBlock("abcd")], finish_reason="stop")


def test_duplicates_are_dropped_whether_fed_or_buffered_and_the_first_copy_wins() -> None:
    c = StepCollector()
    assert c.add(0, A) is Added.ACCEPTED
    assert c.add(0, B) is Added.DUPLICATE
    assert c.add(2, STOP) is Added.BUFFERED
    assert c.add(2, C) is Added.DUPLICATE
    assert c.add(1, B) is Added.ACCEPTED
    assert c.add(1, B) is Added.DUPLICATE
    assert c.result() == Message(content=[TextBlock("ab")], finish_reason="stop")


def test_chunks_after_the_finish_ordinal_are_dropped_and_counted() -> None:
    c = StepCollector()
    assert c.add(3, C) is Added.BUFFERED
    assert c.add(1, STOP) is Added.BUFFERED  # the finish is at 1: ordinal 3 can never be fed
    assert (c.buffered, c.beyond_finish, c.missing()) == (1, 1, [0])
    assert c.add(2, B) is Added.BEYOND_FINISH
    assert c.add(0, A) is Added.ACCEPTED
    assert c.add(5, B) is Added.BEYOND_FINISH
    assert c.beyond_finish == 3
    assert c.result() == Message(content=[TextBlock("a")], finish_reason="stop")


def test_an_ordinal_beyond_the_window_is_refused_and_nothing_changes() -> None:
    c = StepCollector(FoldLimits(reorder_window=4))
    assert c.add(3, C) is Added.BUFFERED
    with pytest.raises(ReorderWindowError) as caught:
        c.add(4, STOP)
    assert (caught.value.ordinal, caught.value.next_ordinal, caught.value.window) == (4, 0, 4)
    assert (c.buffered, c.missing()) == (1, [0, 1, 2])
    for i, ch in enumerate([A, B]):
        c.add(i, ch)
    assert c.add(2, B) is Added.ACCEPTED
    assert c.add(4, STOP) is Added.ACCEPTED  # within the window now that 0..3 were fed
    assert c.result() == Message(content=[TextBlock("abbc")], finish_reason="stop")


def test_negative_ordinals_are_invalid() -> None:
    with pytest.raises(InvalidOrdinal):
        StepCollector().add(-1, A)


def test_fail_records_a_gap_and_closes_the_step() -> None:
    usage = TokenUsage(input_tokens=3)
    c = StepCollector()
    c.add(0, Usage(usage))
    c.add(2, B)
    error = c.fail("gap", "ordinal 1 never arrived")
    assert error == RecordedError("gap", "ordinal 1 never arrived", usage=usage)
    assert c.result() is error
    assert (c.complete, c.buffered, c.missing()) == (False, 0, [])
    assert c.add(1, A) is Added.CLOSED
    assert c.add(0, A) is Added.DUPLICATE
    with pytest.raises(StepStateError):
        c.fail("abandoned", "again")
