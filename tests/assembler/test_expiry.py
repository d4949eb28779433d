"""The decision on a step past its timeout (issue 48), with the in-memory twins: the pure
core (``Assembly``), the registry's twin (``MemoryStepRegistry``) for the claims and a
broker view given per partition. A step is closed ``abandoned`` only when this instance holds
its partition, the partition is caught up and the claim is gone or its silence bound passed;
never because this instance lost the partition or fell behind."""

from __future__ import annotations

import pytest

from tests.assembler.scripts import envelopes, text_step
from tokenwire.broker import MemoryStepRegistry, StepRecord
from tokenwire.schemas import RecordedError
from tokenwire.services.assembler import Assembly, AssemblyConfig
from tokenwire.services.assembler._assembly import DueStep
from tokenwire.services.assembler._consume import Delivery
from tokenwire.services.assembler._expiry import (
    UNANSWERED,
    Expiry,
    PartitionView,
    Unanswered,
    verdict,
)

S = 1_000_000_000
T0 = 1_700_000_000 * S
HELD = PartitionView(owner=True, caught_up=True)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> int:
        return self.now


def _due(reason: str = "abandoned", last: int = T0) -> DueStep:
    return DueStep(("s", 0, 0), reason, last)  # type: ignore[arg-type]  # a literal


@pytest.mark.parametrize(
    ("view", "claim", "reason", "now", "expected"),
    [
        (UNANSWERED, None, "abandoned", T0 + 200 * S, "ask-later"),
        (PartitionView(owner=False, caught_up=True), None, "abandoned", T0, "hand-back"),
        (PartitionView(owner=False, caught_up=False), None, "gap", T0, "hand-back"),
        (PartitionView(owner=True, caught_up=False), None, "abandoned", T0 + 999 * S, "wait"),
        (PartitionView(owner=True, caught_up=False), None, "gap", T0 + 999 * S, "wait"),
        (HELD, UNANSWERED, "gap", T0, "close"),  # a gap needs no claim
        (HELD, UNANSWERED, "abandoned", T0 + 999 * S, "ask-later"),
        (HELD, None, "abandoned", T0 + 1 * S, "close"),  # no claim: nobody can publish
        (HELD, StepRecord("t", idle_s=10.0), "abandoned", T0 + 9 * S, "wait"),
        (HELD, StepRecord("t", idle_s=10.0), "abandoned", T0 + 10 * S, "close"),
        (HELD, StepRecord("t"), "abandoned", T0 + 94 * S, "wait"),  # an older claim: 95 s
        (HELD, StepRecord("t"), "abandoned", T0 + 95 * S, "close"),
    ],
)
def test_the_verdict(
    view: PartitionView | Unanswered,
    claim: StepRecord | Unanswered | None,
    reason: str,
    now: int,
    expected: str,
) -> None:
    assert verdict(_due(reason), view, claim, now) == expected


class Broker:
    """The broker's view per partition, as a test sets it; counts the questions."""

    def __init__(self) -> None:
        self.views: dict[int, PartitionView | Unanswered] = {}
        self.asked: list[int] = []

    async def view_of(self, partition: int) -> PartitionView | Unanswered:
        self.asked.append(partition)
        return self.views.get(partition, HELD)


PARTITION = {"crashed": 0, "live": 0, "unclaimed": 0, "elsewhere": 1, "behind": 2}


async def _setup(clock: Clock, **config: float) -> tuple[Assembly[Delivery], MemoryStepRegistry]:
    assembly: Assembly[Delivery] = Assembly(
        AssemblyConfig(abandon_timeout_s=15.0, gap_timeout_s=15.0, **config),  # type: ignore[arg-type]  # a case's fields, mixed types
        clock=clock,
    )
    registry = MemoryStepRegistry(idle_s=40.0, clock_ns=clock)
    for session, partition in PARTITION.items():
        if session != "unclaimed":
            await registry.claim(session, 0, 0)
        first_two = envelopes(session, 0, 0, text_step(["a", "b"]), t0=clock.now)[:2]
        for i, env in enumerate(first_two):  # no finish: the gateway went quiet
            assembly.feed(env, Delivery(100 * partition + i, None, partition))
    return assembly, registry


def _expiry(assembly: Assembly[Delivery], broker: Broker, registry: MemoryStepRegistry) -> Expiry:
    return Expiry(assembly, broker.view_of, registry, PARTITION.__getitem__)


async def test_lost_partitions_are_handed_back_and_lag_waits() -> None:
    clock = Clock()
    assembly, registry = await _setup(clock)
    registry.records[("live", 0, 0)] = StepRecord("t", idle_s=600.0, time_ns=T0)
    broker = Broker()
    broker.views = {
        1: PartitionView(owner=False, caught_up=True),
        2: PartitionView(owner=True, caught_up=False),
    }
    expiry = _expiry(assembly, broker, registry)
    clock.now += 16 * S  # past the abandon timeout, inside the crashed gateway's 40 s
    first = await expiry.run(clock.now)
    assert [c.record.session for c in first.closed] == ["unclaimed"]  # no gateway can publish
    assert not assembly.is_open(("elsewhere", 0, 0))  # handed back, never closed
    assert sorted(t.seq for t in first.handed_back) == [100, 101]
    assert assembly.is_open(("behind", 0, 0))  # lag: it waits
    assert sorted(broker.asked) == [0, 1, 2]  # one question per partition per pass


async def test_an_abandoned_step_closes_once_its_gateway_can_no_longer_publish() -> None:
    clock = Clock()
    assembly, registry = await _setup(clock)
    registry.records[("live", 0, 0)] = StepRecord("t", idle_s=600.0, time_ns=T0)
    broker = Broker()
    expiry = _expiry(assembly, broker, registry)
    clock.now += 16 * S
    closed = [c.record.session for c in (await expiry.run(clock.now)).closed]
    assert closed == ["unclaimed"]  # held, caught up, and no claim: nobody can publish
    clock.now += 16 * S  # 32 s after the last chunk: the claims' 40 s not passed
    assert (await expiry.run(clock.now)).closed == []
    clock.now += 16 * S  # 48 s: passed
    closed_now = (await expiry.run(clock.now)).closed
    assert {c.record.session for c in closed_now} == {"crashed", "elsewhere", "behind"}
    for step in closed_now:
        assert isinstance(step.record.outcome, RecordedError)
        assert step.record.outcome.kind == "abandoned"
    assert assembly.is_open(("live", 0, 0))  # its gateway may publish for 600 s


async def test_an_unanswered_question_decides_nothing_and_is_asked_again() -> None:
    clock = Clock()
    assembly, registry = await _setup(clock)
    broker = Broker()
    broker.views = {0: UNANSWERED, 1: UNANSWERED, 2: UNANSWERED}
    expiry = _expiry(assembly, broker, registry)
    clock.now += 16 * S
    out = await expiry.run(clock.now)
    assert (out.closed, out.handed_back, out.waiting) == ([], [], 5)
    assert broker.asked == [0]  # nothing more is asked after the first unanswered question
    assert len(assembly.due(clock.now)) == 5  # still due: asked again at the next pass
    broker.views = {}
    clock.now += 60 * S  # every claim's 40 s passed too
    assert len((await expiry.run(clock.now)).closed) == 5


async def test_claim_reads_per_pass_are_bounded() -> None:
    clock = Clock()
    assembly, registry = await _setup(clock)
    expiry = _expiry(assembly, Broker(), registry)
    expiry.max_claim_reads = 2
    clock.now += 60 * S
    assert len((await expiry.run(clock.now)).closed) == 2
    assert len((await expiry.run(clock.now)).closed) == 2
    assert len((await expiry.run(clock.now)).closed) == 1
