"""``Assembly.feed_frame`` (and ``StepCollector.add_run`` under it) against the chunk-by-chunk
path as the oracle: for any frames of a step, in any delivery order, duplicated, with the
finish anywhere, the frame path gives the same outcomes, the same taken verdicts and the same
open state as feeding each chunk alone; and an in-order frame takes the fast path."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenwire.fold import Added, StepCollector
from tokenwire.schemas import (
    ChunkEnvelope,
    Finish,
    Message,
    StreamChunk,
    TextDelta,
    ToolCallDelta,
)
from tokenwire.services.assembler._assembly import Assembly, ClosedStep, FedFrame, Outcome

STOP = Finish(reason="stop")


def _chunk(i: int) -> StreamChunk:
    if i % 7 == 3:
        return ToolCallDelta(
            index=1,
            id="c1",
            name="f" if i == 3 else None,
            arguments_delta='{"a":1}' if i == 3 else "",
        )
    return TextDelta(index=0, text=f"t{i} ")


def _envelopes(chunks: list[StreamChunk], step: int = 0) -> list[ChunkEnvelope]:
    return [ChunkEnvelope("s", 0, step, o, 1_000 + o, "p", "m", c) for o, c in enumerate(chunks)]


def _by_chunk(assembly: Assembly[int], frame: list[ChunkEnvelope], token: int) -> FedFrame[int]:
    """The oracle: what the assembler did before frames had a path of their own."""
    outcomes: list[Outcome[int] | None] = [assembly.feed(e, token) for e in frame]
    taken = any(o is None or isinstance(o, ClosedStep) for o in outcomes)
    return FedFrame(taken, [o for o in outcomes if o is not None])


@st.composite
def deliveries(draw: st.DrawFn) -> list[tuple[int, list[ChunkEnvelope]]]:
    """A step of n chunks, a finish somewhere (usually last, sometimes inside, sometimes
    none), cut into frames of consecutive ordinals, delivered shuffled with duplicates."""
    n = draw(st.integers(1, 40))
    chunks = [_chunk(i) for i in range(n)]
    finish_at = draw(st.one_of(st.just(n - 1), st.integers(0, n - 1), st.none()))
    if finish_at is not None:
        chunks[finish_at] = STOP
    cuts = sorted(draw(st.sets(st.integers(1, max(1, n - 1)), max_size=8)) - {n})
    bounds = [0, *cuts, n]
    envs = _envelopes(chunks)
    frames = [envs[a:b] for a, b in itertools.pairwise(bounds) if a < b]
    tokens = list(range(len(frames)))
    order = draw(st.permutations(tokens))
    again = draw(st.lists(st.sampled_from(tokens), max_size=3))
    return [(t, frames[t]) for t in [*order, *again]]


@settings(max_examples=300, deadline=None)
@given(deliveries())
def test_a_frame_gives_what_its_chunks_one_by_one_give(
    plan: list[tuple[int, list[ChunkEnvelope]]],
) -> None:
    framed: Assembly[int] = Assembly(clock=lambda: 7)
    oracle: Assembly[int] = Assembly(clock=lambda: 7)
    for token, frame in plan:
        assert framed.feed_frame(frame, token) == _by_chunk(oracle, frame, token)
    assert framed.open_steps == oracle.open_steps
    assert sorted(framed.held_tokens()) == sorted(oracle.held_tokens())
    assert framed.close_all(9) == oracle.close_all(9)


def test_an_in_order_frame_touches_the_step_once() -> None:
    reads: list[int] = []

    def clock() -> int:
        reads.append(1)
        return len(reads)

    assembly: Assembly[int] = Assembly(clock=clock)
    envs = _envelopes([_chunk(i) for i in range(99)] + [STOP])
    assert assembly.feed_frame(envs[:60], 1) == FedFrame(True, [])
    assert len(reads) == 2  # the step's start and one touch, not one per chunk
    fed = assembly.feed_frame(envs[60:], 2)
    assert len(reads) == 4  # one touch and the close
    (closed,) = fed.outcomes
    assert isinstance(closed, ClosedStep)
    assert closed.tokens == (1, 2)
    assert closed.record.chunks == envs
    outcome = closed.record.outcome
    assert isinstance(outcome, Message)
    assert outcome.text == "".join(f"t{i} " for i in range(99) if i % 7 != 3)


def test_add_run_takes_only_a_run_that_continues_the_step_in_order() -> None:
    chunks = [_chunk(i) for i in range(5)]
    c = StepCollector()
    assert not c.add_run(1, chunks)  # not the next ordinal
    assert not c.add_run(0, [chunks[0], STOP, chunks[1]])  # a finish inside
    assert c.next_ordinal == 0  # nothing taken by a refusal
    assert c.add_run(0, chunks)
    assert c.next_ordinal == 5
    assert c.add(7, chunks[0]) is Added.BUFFERED
    assert not c.add_run(5, chunks)  # something waits in the buffer: one by one
    d = StepCollector()
    assert d.add_run(0, [*chunks, STOP])
    assert d.complete
    assert not d.add_run(6, chunks)  # after the finish
