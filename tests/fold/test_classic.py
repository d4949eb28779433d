"""The classic ways a token-stream fold goes wrong, each by name, on a hand-written stream."""

from __future__ import annotations

import pytest

from tokenwire.fold import ChunkAfterFinish, StepFold, StepStateError, fold
from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    Finish,
    Message,
    ReasoningBlock,
    ReasoningDelta,
    RecordedError,
    StepError,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallBlock,
    ToolCallDelta,
    Usage,
)

USAGE = TokenUsage(input_tokens=12, output_tokens=34)


def fed(*chunks: StreamChunk) -> StepFold:
    step = StepFold()
    for chunk in chunks:
        step.feed(chunk)
    return step


def test_partial_json_arguments_never_surface_before_the_finish() -> None:
    step = fed(ToolCallDelta(index=0, id="call_1", name="read", arguments_delta='{"pa'))
    assert step.snapshot() == []
    assert not step.finished
    with pytest.raises(StepStateError):
        step.result()
    step.feed(ToolCallDelta(index=0, id="", arguments_delta='th": "/tmp"}'))
    assert step.snapshot() == []
    step.feed(Finish(reason="tool-calls"))
    assert step.result() == Message(
        content=[ToolCallBlock(id="call_1", name="read", arguments='{"path": "/tmp"}')],
        finish_reason="tool-calls",
    )


def test_arguments_stay_raw_strings_even_when_they_are_not_json() -> None:
    result = fold(
        [ToolCallDelta(index=0, id="c", name="f", arguments_delta='{"pa'), Finish(reason="stop")]
    )
    assert isinstance(result, Message)
    assert result.tool_calls == [ToolCallBlock(id="c", name="f", arguments='{"pa')]


def test_two_interleaved_tool_calls_never_splice() -> None:
    result = fold(
        [
            ToolCallDelta(index=1, id="call_a", name="weather", arguments_delta='{"ci'),
            ToolCallDelta(index=2, id="call_b", name="time", arguments_delta='{"tz'),
            ToolCallDelta(index=1, id="call_a", arguments_delta='ty": "Oslo"}'),
            ToolCallDelta(index=2, id="call_b", arguments_delta='": "UTC"}'),
            Finish(reason="tool-calls"),
        ]
    )
    assert isinstance(result, Message)
    assert result.tool_calls == [
        ToolCallBlock(id="call_a", name="weather", arguments='{"city": "Oslo"}'),
        ToolCallBlock(id="call_b", name="time", arguments='{"tz": "UTC"}'),
    ]


def test_a_second_tool_call_on_the_same_index_is_refused_not_spliced() -> None:
    result = fold(
        [
            ToolCallDelta(index=0, id="call_a", name="f", arguments_delta='{"x": 1}'),
            ToolCallDelta(index=0, id="call_b", name="g", arguments_delta='{"y": 2}'),
            Finish(reason="tool-calls"),
        ]
    )
    assert isinstance(result, RecordedError)
    assert result.kind == "contract"
    assert "call_a" in result.message
    assert "call_b" in result.message


def test_a_small_argument_arriving_whole_waits_for_the_end_of_the_stream() -> None:
    call = ToolCallBlock(id="call_1", name="now", arguments="{}")
    step = fed(
        BlockStart(index=0, block_type="tool-call"),
        ToolCallDelta(index=0, id="call_1", name="now", arguments_delta="{}"),
        BlockEnd(index=0, block=call),
    )
    assert step.snapshot() == []
    with pytest.raises(StepStateError):
        step.result()
    step.feed(Finish(reason="tool-calls"))
    assert step.result() == Message(content=[call], finish_reason="tool-calls")


def test_an_empty_delta_changes_nothing_and_opens_nothing() -> None:
    step = fed(
        TextDelta(index=3, text=""),
        ReasoningDelta(index=4, text=""),
        ToolCallDelta(index=5, id="call_x", arguments_delta=""),
    )
    assert step.snapshot() == []
    step.feed(TextDelta(index=0, text="hi"))
    step.feed(TextDelta(index=0, text=""))
    assert step.snapshot() == [TextBlock("hi")]
    step.feed(Finish(reason="stop"))
    assert step.result() == Message(content=[TextBlock("hi")], finish_reason="stop")


def test_chunks_for_an_ended_block_are_ignored_and_counted() -> None:
    result = fold(
        [
            TextDelta(index=0, text="hel"),
            BlockEnd(index=0, block=TextBlock("hello")),
            TextDelta(index=0, text="INJECTED"),
            BlockStart(index=0, block_type="text"),
            BlockEnd(index=0, block=TextBlock("replaced")),
            ToolCallDelta(index=0, id="c", name="f", arguments_delta="{}"),
            Finish(reason="stop"),
        ]
    )
    assert result == Message(content=[TextBlock("hello")], finish_reason="stop", ignored_deltas=4)


def test_block_end_is_authoritative() -> None:
    signed = ReasoningBlock("I think", signature="sig-123")
    redacted = ReasoningBlock("", redacted="opaque==")
    result = fold(
        [
            ReasoningDelta(index=0, text="I thi"),
            ReasoningDelta(index=0, text="nk"),
            BlockEnd(index=0, block=signed),
            BlockStart(index=1, block_type="reasoning"),
            BlockEnd(index=1, block=redacted),
            Finish(reason="stop"),
        ]
    )
    assert result == Message(content=[signed, redacted], finish_reason="stop")


def test_delta_only_protocols_close_their_blocks_at_finish_in_index_order() -> None:
    result = fold(
        [
            TextDelta(index=2, text="answer"),
            ReasoningDelta(index=0, text="think"),
            ToolCallDelta(index=1, id="c", name="f", arguments_delta="[1]"),
            ReasoningDelta(index=0, text="ing"),
            Finish(reason="tool-calls"),
        ]
    )
    assert result == Message(
        content=[
            ReasoningBlock("thinking"),
            ToolCallBlock(id="c", name="f", arguments="[1]"),
            TextBlock("answer"),
        ],
        finish_reason="tool-calls",
    )


def test_long_text_crosses_many_joined_runs_intact() -> None:
    pieces = [f"{i}·" for i in range(5000)]
    step = fed(*(TextDelta(index=0, text=p) for p in pieces))
    assert step.snapshot() == [TextBlock("".join(pieces))]
    step.feed(Finish(reason="stop"))
    assert step.result() == Message(content=[TextBlock("".join(pieces))], finish_reason="stop")


def test_max_tokens_drops_complete_and_partial_tool_calls_and_keeps_the_text() -> None:
    done = ToolCallBlock(id="call_a", name="f", arguments='{"a": 1}')
    result = fold(
        [
            TextDelta(index=0, text="Let me check."),
            ToolCallDelta(index=1, id="call_a", name="f", arguments_delta='{"a": 1}'),
            BlockEnd(index=1, block=done),
            ToolCallDelta(index=2, id="call_b", name="g", arguments_delta='{"q": "unfini'),
            Usage(USAGE),
            Finish(reason="max-tokens"),
        ]
    )
    assert result == Message(
        content=[TextBlock("Let me check.")],
        finish_reason="max-tokens",
        usage=USAGE,
        dropped_tool_calls=[done, ToolCallBlock(id="call_b", name="g", arguments='{"q": "unfini')],
        truncated_blocks=[0, 2],  # never ended: the text (delta-only) and the cut call
    )


@pytest.mark.parametrize(
    ("finish", "expected"),
    [
        (
            Finish(reason="error", error=StepError("overloaded", retryable=True, code="529")),
            RecordedError("provider", "overloaded", retryable=True, code="529", usage=USAGE),
        ),
        (
            Finish(reason="aborted"),
            RecordedError("aborted", "the stream ended with finish aborted", usage=USAGE),
        ),
    ],
)
def test_error_and_aborted_finishes_record_an_error_never_a_message(finish, expected) -> None:
    result = fold(
        [
            TextDelta(index=0, text="partial answer"),
            ToolCallDelta(index=1, id="c", name="f", arguments_delta="{}"),
            Usage(USAGE),
            finish,
        ]
    )
    assert result == expected


def test_a_later_usage_replaces_an_earlier_one_and_finish_fields_are_copied() -> None:
    final = TokenUsage(input_tokens=5, output_tokens=9, cache_read_tokens=100)
    result = fold(
        [
            Usage(TokenUsage(input_tokens=5)),
            TextDelta(index=0, text="x"),
            Usage(final),
            Finish(reason="content-filter", replay_state={"response_id": "resp_1"}),
        ]
    )
    assert result == Message(
        content=[TextBlock("x")],
        finish_reason="content-filter",
        usage=final,
        replay_state={"response_id": "resp_1"},
    )


@pytest.mark.parametrize(
    "late",
    [
        BlockStart(index=9, block_type="text"),
        TextDelta(index=0, text="more"),
        ReasoningDelta(index=0, text="more"),
        ToolCallDelta(index=1, id="c", name="f", arguments_delta="{}"),
        BlockEnd(index=0, block=TextBlock("x")),
        Usage(USAGE),
        Finish(reason="stop"),
    ],
)
def test_any_chunk_after_finish_raises_and_changes_nothing(late: StreamChunk) -> None:
    step = fed(TextDelta(index=0, text="done"), Finish(reason="stop"))
    before = step.result()
    with pytest.raises(ChunkAfterFinish) as caught:
        step.feed(late)
    assert caught.value.chunk_type == late.__struct_config__.tag
    assert caught.value.ended_by == "finish"
    assert step.result() is before


def test_fold_raises_on_a_chunk_after_finish() -> None:
    with pytest.raises(ChunkAfterFinish):
        fold([Finish(reason="stop"), TextDelta(index=0, text="x")])


def test_a_stream_without_finish_is_abandoned() -> None:
    result = fold([TextDelta(index=0, text="cut"), Usage(USAGE)])
    assert result == RecordedError("abandoned", "the chunks ended without a finish", usage=USAGE)


@pytest.mark.parametrize(
    ("chunks", "needle"),
    [
        ([TextDelta(index=0, text="a"), ReasoningDelta(index=0, text="b")], "reasoning delta"),
        (
            [ToolCallDelta(index=0, id="c", name="f"), TextDelta(index=0, text="b")],
            "text delta",
        ),
        ([TextDelta(index=0, text="a"), BlockStart(index=0, block_type="image")], "block-start"),
        ([TextDelta(index=0, text="a"), BlockEnd(index=0, block=ReasoningBlock("a"))], "block-end"),
        ([ToolCallDelta(index=0, id="c", arguments_delta="{}")], "never received a name"),
        ([BlockStart(index=0, block_type="image")], "never ended"),
    ],
)
def test_contract_breaks_inside_a_step_record_a_contract_error(chunks, needle) -> None:
    result = fold([*chunks, Finish(reason="stop")])
    assert isinstance(result, RecordedError)
    assert result.kind == "contract"
    assert needle in result.message


def test_fail_ends_the_step_with_a_recorded_error() -> None:
    step = fed(TextDelta(index=0, text="so far"), Usage(USAGE))
    error = step.fail("gap", "ordinal 7 missing")
    assert error == RecordedError("gap", "ordinal 7 missing", usage=USAGE)
    assert step.finished
    assert step.result() is error
    assert step.snapshot() == []
    with pytest.raises(ChunkAfterFinish) as caught:
        step.feed(TextDelta(index=0, text="late"))
    assert caught.value.ended_by == "gap"
    with pytest.raises(StepStateError):
        step.fail("abandoned", "again")


def test_fail_after_a_normal_finish_is_refused() -> None:
    step = fed(Finish(reason="stop"))
    with pytest.raises(StepStateError):
        step.fail("gap", "too late")


def test_feeding_something_that_is_not_a_chunk_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="not a StreamChunk"):
        StepFold().feed(TextBlock("x"))  # type: ignore[arg-type]  # the point: a block is not a chunk
