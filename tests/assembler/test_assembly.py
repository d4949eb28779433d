"""Unit tests of the pure core: hand-built envelopes, an injected clock, no broker, no store."""

from __future__ import annotations

import random

import pytest

from tests.assembler.scripts import (
    envelopes,
    error_step,
    max_tokens_step,
    random_script,
    reasoning_step,
    text_step,
    tools_step,
)
from tokenwire.schemas import (
    ChunkEnvelope,
    Finish,
    Message,
    RecordedError,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
)
from tokenwire.services.assembler import (
    Assembly,
    AssemblyConfig,
    AssemblyFullError,
    ClosedStep,
    Poisoned,
    Settled,
)

S = 1_000_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_000 * S

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make(clock: Clock, **config: object) -> Assembly[int]:
    return Assembly(AssemblyConfig(**config), clock=clock)  # type: ignore[arg-type]  # overrides given by keyword, checked by the dataclass at run time


def feed_all(a: Assembly[int], envs: list[ChunkEnvelope], tokens: list[int] | None = None):
    tokens = tokens if tokens is not None else [e.ordinal for e in envs]
    return [a.feed(e, t) for e, t in zip(envs, tokens, strict=True)]


@pytest.mark.parametrize(
    "script",
    [
        text_step(["Hel", "lo ", "world"]),
        reasoning_step(["think ", "hard"], ["4", "2"]),
        tools_step("Paris"),
        error_step(),
    ],
    ids=["text", "reasoning", "tools", "error"],
)
def test_in_order_step_closes_on_its_finish(clock: Clock, script) -> None:
    a = make(clock)
    envs = envelopes("s1", 0, 0, script)
    out = feed_all(a, envs)
    assert out[:-1] == [None] * (len(envs) - 1)
    closed = out[-1]
    assert isinstance(closed, ClosedStep)
    assert closed.reason == "complete"
    assert closed.record.outcome == script.expected
    assert closed.record.chunks == envs
    assert (closed.record.provider, closed.record.model) == ("scripted", "m-1")
    assert sorted(closed.tokens) == list(range(len(envs)))
    assert closed.record.completed_ns == clock.now
    assert a.open_steps == 0


def test_max_tokens_drops_the_tool_call(clock: Clock) -> None:
    closed = feed_all(make(clock), envelopes("s", 0, 0, max_tokens_step()))[-1]
    assert isinstance(closed, ClosedStep)
    message = closed.record.outcome
    assert isinstance(message, Message)
    assert message.tool_calls == []
    assert [c.id for c in message.dropped_tool_calls] == ["call_c"]
    assert message.text == "Let me search."


def test_reordered_and_duplicated_delivery_gives_the_same_record(clock: Clock) -> None:
    script = text_step(["a", "b", "c", "d", "e"])
    envs = envelopes("s", 1, 2, script)
    rng = random.Random(7)
    shuffled = [*envs, envs[1], envs[3], envs[0]]
    rng.shuffle(shuffled)
    # put one copy of the finish last so the step cannot close before every chunk came
    finish = envs[-1]
    shuffled = [e for e in shuffled if e is not finish] + [finish]
    a = make(clock)
    out = [a.feed(e, 100 + e.ordinal) for e in shuffled]
    closed = out[-1]
    assert isinstance(closed, ClosedStep)
    assert all(o is None for o in out[:-1])
    assert closed.record.outcome == script.expected
    assert closed.record.chunks == envs
    # equal tokens (same broker message redelivered) are kept once
    assert sorted(closed.tokens) == [100 + i for i in range(len(envs))]


def test_finish_before_the_gap_is_filled_waits(clock: Clock) -> None:
    envs = envelopes("s", 0, 0, text_step(["x", "y"]))  # 0 x, 1 y, 2 usage, 3 finish
    a = make(clock)
    assert [a.feed(envs[i], i) for i in (0, 3, 2)] == [None, None, None]
    closed = a.feed(envs[1], 1)
    assert isinstance(closed, ClosedStep)
    assert isinstance(closed.record.outcome, Message)
    assert closed.record.outcome.text == "xy"


def test_gap_timeout_records_a_gap_error_with_the_chunks_present(clock: Clock) -> None:
    envs = envelopes("s", 0, 0, text_step(["x", "y", "z"]))  # ordinals 0..4
    a = make(clock, gap_timeout_s=10, abandon_timeout_s=100)
    for i in (0, 2, 3, 4):
        assert a.feed(envs[i], i) is None
    clock.now += 9 * S
    assert a.expire(clock.now) == []
    clock.now += 1 * S
    [closed] = a.expire(clock.now)
    assert closed.reason == "gap"
    err = closed.record.outcome
    assert isinstance(err, RecordedError)
    assert err.kind == "gap"
    assert "[1]" in err.message
    assert [e.ordinal for e in closed.record.chunks] == [0, 2, 3, 4]
    assert sorted(closed.tokens) == [0, 2, 3, 4]
    assert a.open_steps == 0
    # the missing chunk arriving late is settled (acked, counted), not re-opened
    late = a.feed(envs[1], 1)
    assert late == Settled(1, ("s", 0, 0), late=True)


def test_abandoned_step_closes_after_the_abandon_timeout(clock: Clock) -> None:
    envs = envelopes("s", 0, 0, text_step(["x", "y"]))
    a = make(clock, gap_timeout_s=5, abandon_timeout_s=120)
    a.feed(envs[0], 0)
    clock.now += 60 * S
    a.feed(envs[1], 1)  # progress restarts the timer
    clock.now += 119 * S
    assert a.expire(clock.now) == []
    clock.now += 1 * S
    [closed] = a.expire(clock.now)
    assert closed.reason == "abandoned"
    assert isinstance(closed.record.outcome, RecordedError)
    assert closed.record.outcome.kind == "abandoned"
    assert [e.ordinal for e in closed.record.chunks] == [0, 1]
    assert closed.record.completed_ns == clock.now


def test_expire_only_closes_what_is_due_and_keeps_the_rest(clock: Clock) -> None:
    a = make(clock, gap_timeout_s=10, abandon_timeout_s=30)
    old = envelopes("old", 0, 0, text_step(["a"]))
    young = envelopes("young", 0, 0, text_step(["b"]))
    finished_gap = envelopes("gap", 0, 0, text_step(["c"]))
    a.feed(old[0], 0)
    a.feed(finished_gap[2], 1)  # finish without ordinals 0, 1
    clock.now += 20 * S
    a.feed(young[0], 2)
    closed = a.expire(clock.now)
    assert [c.record.session for c in closed] == ["gap"]
    clock.now += 10 * S
    assert [c.record.session for c in a.expire(clock.now)] == ["old"]
    assert a.open_steps == 1


def test_chunk_beyond_finish_is_poison_while_open_and_after_close(clock: Clock) -> None:
    envs = envelopes("s", 0, 0, text_step(["x"]))  # 0 x, 1 usage, 2 finish
    beyond = ChunkEnvelope("s", 0, 0, 3, 0, "scripted", "m-1", TextDelta(index=0, text="!"))
    a = make(clock)
    a.feed(envs[2], 2)
    out = a.feed(beyond, 3)
    assert isinstance(out, Poisoned)
    assert out.reason == "beyond-finish"
    a.feed(envs[0], 0)
    closed = a.feed(envs[1], 1)
    assert isinstance(closed, ClosedStep)
    assert closed.record.outcome == text_step(["x"]).expected
    assert 3 not in closed.tokens
    after = a.feed(beyond, 33)
    assert isinstance(after, Poisoned)
    assert after.reason == "beyond-finish"
    assert a.feed(envs[1], 11) == Settled(11, ("s", 0, 0), late=False)


def test_invalid_ordinal_and_reorder_window_are_poison(clock: Clock) -> None:
    from tokenwire.fold import FoldLimits

    a = make(clock, fold_limits=FoldLimits(reorder_window=8))
    neg = ChunkEnvelope("s", 0, 0, -1, 0, "p", "m", TextDelta(index=0, text="x"))
    far = ChunkEnvelope("s", 0, 0, 8, 0, "p", "m", TextDelta(index=0, text="x"))
    assert isinstance(bad := a.feed(neg, 1), Poisoned)
    assert bad.reason == "invalid-ordinal"
    assert isinstance(bad := a.feed(far, 2), Poisoned)
    assert bad.reason == "reorder-window"
    assert a.open_steps == 0  # a rejected first chunk leaves nothing open


def test_bound_on_open_steps(clock: Clock) -> None:
    a = make(clock, max_open_steps=2)
    first = [
        ChunkEnvelope(f"s{i}", 0, 0, 0, 0, "p", "m", TextDelta(index=0, text="x")) for i in range(3)
    ]
    a.feed(first[0], 0)
    a.feed(first[1], 1)
    assert not a.has_room(first[2])
    with pytest.raises(AssemblyFullError) as info:
        a.feed(first[2], 2)
    assert (info.value.open_steps, info.value.limit) == (2, 2)
    more = ChunkEnvelope("s0", 0, 0, 1, 0, "p", "m", Finish(reason="stop"))
    assert a.has_room(more)
    assert isinstance(a.feed(more, 3), ClosedStep)
    assert a.has_room(first[2])


def test_closed_memory_is_bounded_and_remember_closed_settles(clock: Clock) -> None:
    a = make(clock, closed_memory=2)
    for i in range(3):
        env = ChunkEnvelope(f"s{i}", 0, 0, 0, 0, "p", "m", Finish(reason="stop"))
        assert isinstance(a.feed(env, i), ClosedStep)
    assert not a.knows(("s0", 0, 0))
    assert a.knows(("s1", 0, 0))
    assert a.knows(("s2", 0, 0))
    a.remember_closed(("x", 1, 1))
    assert a.knows(("x", 1, 1))
    assert not a.knows(("s1", 0, 0))
    env = ChunkEnvelope("x", 1, 1, 0, 0, "p", "m", TextDelta(index=0, text="x"))
    assert a.feed(env, 9) == Settled(9, ("x", 1, 1), late=False)


def test_close_order_depends_only_on_feed_order() -> None:
    """The same interleaving closes steps in the same order whatever the clock does."""
    rng = random.Random(1234)
    print("seed 1234")
    streams = [envelopes(f"s{i % 3}", i // 3, 0, random_script(rng)) for i in range(12)]
    order: list[ChunkEnvelope] = []
    cursors = [0] * len(streams)
    while any(c < len(s) for c, s in zip(cursors, streams, strict=True)):
        i = rng.choice([k for k, s in enumerate(streams) if cursors[k] < len(s)])
        order.append(streams[i][cursors[i]])
        cursors[i] += 1

    def run(step_ns: int) -> list[tuple[str, int, int]]:
        clock = Clock()
        a: Assembly[int] = Assembly(clock=clock)
        keys = []
        for n, env in enumerate(order):
            clock.now += step_ns
            out = a.feed(env, n)
            if isinstance(out, ClosedStep):
                keys.append(out.key)
        return keys

    assert run(1) == run(7 * S)
    assert len(run(1)) == 12


def test_usage_before_finish_is_kept(clock: Clock) -> None:
    usage = TokenUsage(input_tokens=3, output_tokens=1)
    from tokenwire.schemas import Usage

    chunks: list[StreamChunk] = [
        TextDelta(index=0, text="k"),
        Usage(usage=usage),
        Finish(reason="stop"),
    ]
    envs = [ChunkEnvelope("s", 0, 0, i, 0, "p", "m", c) for i, c in enumerate(chunks)]
    closed = feed_all(make(clock), envs)[-1]
    assert closed.record.outcome == Message([TextBlock("k")], "stop", usage=usage)
