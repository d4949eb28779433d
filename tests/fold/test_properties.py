"""Property tests: any stream an adapter may legally send folds back to the blocks it streamed.

Hypothesis runs derandomized with no example database, so CI sees the same examples every run
(a failure prints its minimal example; re-running reproduces it).
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fold.plans import Plan, plans
from tokenwire.fold import Added, FoldLimits, StepCollector, StepFold, fold
from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    ContentBlock,
    Finish,
    Message,
    ReasoningBlock,
    ReasoningDelta,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallBlock,
    Usage,
)

PROPERTY = settings(
    derandomize=True,
    database=None,
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
NORMAL_FINISHES = st.sampled_from(["stop", "tool-calls", "content-filter", "refusal"])
USAGES = st.none() | st.builds(
    TokenUsage,
    input_tokens=st.none() | st.integers(0, 10**6),
    output_tokens=st.none() | st.integers(0, 10**6),
    reasoning_tokens=st.none() | st.integers(0, 10**6),
)


@PROPERTY
@given(plan=plans(), reason=NORMAL_FINISHES, usage=USAGES)
def test_any_stream_folds_back_to_its_blocks(plan: Plan, reason, usage) -> None:
    tail: list[StreamChunk] = [Usage(usage)] if usage else []
    result = fold([*plan.chunks, *tail, Finish(reason=reason, replay_state={"id": "r1"})])
    assert result == Message(
        content=plan.expected_content(),
        finish_reason=reason,
        usage=usage,
        replay_state={"id": "r1"},
    )


@PROPERTY
@given(plan=plans())
def test_snapshots_only_grow_and_never_show_a_tool_call(plan: Plan) -> None:
    step = StepFold()
    oracle = _SnapshotOracle(plan)
    previous: list[ContentBlock] = []
    for chunk in plan.chunks:
        step.feed(chunk)
        oracle.feed(chunk)
        snapshot = step.snapshot()
        assert snapshot == oracle.snapshot()
        assert not any(isinstance(b, ToolCallBlock) for b in snapshot)
        assert _grows_into(previous, snapshot)
        previous = snapshot
    step.feed(Finish(reason="stop"))
    assert _grows_into(previous, step.snapshot())


@PROPERTY
@given(plan=plans(truncate=True))
def test_max_tokens_drops_every_tool_call_and_keeps_the_rest(plan: Plan) -> None:
    result = fold([*plan.chunks, Finish(reason="max-tokens")])
    assert isinstance(result, Message)
    assert result.tool_calls == []
    assert result.content == plan.expected_content(drop_tool_calls=True)
    calls = [p for p in sorted(plan.blocks, key=lambda p: p.index)]
    assert result.dropped_tool_calls == [
        p.block for p in calls if isinstance(p.block, ToolCallBlock)
    ]


@PROPERTY
@given(plan=plans(), data=st.data())
def test_collector_gives_the_same_message_in_any_delivery_order(plan: Plan, data) -> None:
    chunks = [*plan.chunks, Finish(reason="stop")]
    ordinals = list(range(len(chunks)))
    duplicates = data.draw(st.lists(st.sampled_from(ordinals), max_size=6), label="duplicates")
    delivery = data.draw(st.permutations(ordinals + duplicates), label="delivery")
    collector = StepCollector(FoldLimits(reorder_window=len(chunks)))
    seen: set[int] = set()
    for ordinal in delivery:
        outcome = collector.add(ordinal, chunks[ordinal])
        assert outcome is _expected_outcome(seen, ordinal)
        seen.add(ordinal)
        assert collector.missing() == _expected_missing(seen, finish_at=len(chunks) - 1)
        assert collector.complete == (seen == set(ordinals))
    assert collector.result() == Message(content=plan.expected_content(), finish_reason="stop")


# -- oracles ---------------------------------------------------------------------------------


class _SnapshotOracle:
    """What a viewer may see so far, computed from the plan and the chunks sent."""

    def __init__(self, plan: Plan) -> None:
        self.kind = {p.index: type(p.block) for p in plan.blocks}
        self.opened: set[int] = set()
        self.sent: dict[int, list[str]] = {}
        self.ended: dict[int, ContentBlock] = {}

    def feed(self, chunk: StreamChunk) -> None:
        match chunk:
            case BlockStart(index=i):
                self.opened.add(i)
            case TextDelta(index=i, text=t) | ReasoningDelta(index=i, text=t) if t:
                self.opened.add(i)
                self.sent.setdefault(i, []).append(t)
            case BlockEnd(index=i, block=b):
                self.ended[i] = b
            case _:
                pass

    def snapshot(self) -> list[ContentBlock]:
        out: list[ContentBlock] = []
        for i in sorted(self.opened | self.ended.keys()):
            if i in self.ended:
                if not isinstance(self.ended[i], ToolCallBlock):
                    out.append(self.ended[i])
            elif (kind := self.kind[i]) in (TextBlock, ReasoningBlock):
                out.append(kind("".join(self.sent.get(i, []))))
        return out


def _grows_into(before: list[ContentBlock], after: list[ContentBlock]) -> bool:
    """Every earlier block is, in order, a prefix of some later block (new blocks may appear)."""
    rest = iter(after)
    return all(any(_is_prefix(b, a) for a in rest) for b in before)


def _is_prefix(before: ContentBlock, after: ContentBlock) -> bool:
    if type(before) is not type(after):
        return False
    if isinstance(before, TextBlock | ReasoningBlock):
        return after.text.startswith(before.text)  # type: ignore[union-attr]
    return before == after


def _expected_outcome(seen: set[int], ordinal: int) -> Added:
    if ordinal in seen:
        return Added.DUPLICATE
    return Added.ACCEPTED if all(o in seen for o in range(ordinal)) else Added.BUFFERED


def _expected_missing(seen: set[int], finish_at: int) -> list[int]:
    first_unseen = next(o for o in range(len(seen) + 1) if o not in seen)
    upper = finish_at if finish_at in seen else max(seen)
    return [o for o in range(first_unseen, upper) if o not in seen]


def _without_text(outcome: object) -> object:
    """The outcome with every text and reasoning block emptied (the oracle of keep_text)."""
    if not isinstance(outcome, Message):
        return outcome
    content = [
        TextBlock("")
        if isinstance(b, TextBlock)
        else ReasoningBlock("", b.signature, b.redacted)
        if isinstance(b, ReasoningBlock)
        else b
        for b in outcome.content
    ]
    return msgspec.structs.replace(outcome, content=content)


@PROPERTY
@given(plan=plans(), reason=NORMAL_FINISHES | st.just("max-tokens"), small=st.booleans())
def test_a_fold_keeping_no_text_ends_the_same_way_without_the_text(
    plan: Plan, reason, small: bool
) -> None:
    """keep_text=False (the events feed's renderer) applies the same rules and bounds: the
    same outcome, every text and reasoning block empty; the same limit error when the step's
    bytes exceed a bound it is given."""
    limits = FoldLimits(max_step_bytes=16) if small else FoldLimits()
    chunks = [*plan.chunks, Finish(reason=reason)]
    kept, counted = StepFold(limits), StepFold(limits, keep_text=False)
    for chunk in chunks:
        kept.feed(chunk)
        counted.feed(chunk)
    assert counted.result() == _without_text(kept.result())


@pytest.mark.parametrize("by_reference", [False, True])
@pytest.mark.parametrize("bound", [10, 11, 12, 1000])
def test_a_fold_keeping_no_text_counts_block_ends_alike(by_reference: bool, bound: int) -> None:
    """A block-end after streamed text (its block whole, or by reference to the deltas) adds
    the same bytes whether or not the text was kept: the limit trips at the same bound."""
    end = TextBlock("" if by_reference else "hello world")
    chunks: list[StreamChunk] = [
        TextDelta(index=0, text="hello "),
        TextDelta(index=0, text="world"),
        BlockEnd(index=0, block=end, by_reference=by_reference),
        Finish(reason="stop"),
    ]
    kept, counted = (
        StepFold(FoldLimits(max_step_bytes=bound)),
        StepFold(FoldLimits(max_step_bytes=bound), keep_text=False),
    )
    for chunk in chunks:
        kept.feed(chunk)
        counted.feed(chunk)
    assert counted.result() == _without_text(kept.result())
