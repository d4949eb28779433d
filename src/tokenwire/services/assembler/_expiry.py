"""Whether a step past its timeout cannot finish, is lag, or is another owner's (issue 48).

The Assembly lists a step silent on this instance for its timeout as due; the silence may be
this instance's own (it lost the partition, or it is behind). So a due step is closed only
when the broker shows it cannot finish: this instance holds the partition's pin (else its
messages are handed back), the partition is caught up (else it waits: that is lag), and, for
``abandoned``, the step's claim is gone or past its gateway's silence bound. A question the
broker does not answer decides nothing; each pass is bounded. docs/assembler.md, "A due step
asks the broker before it is closed"; ADR 0035.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeAlias, assert_never

from tokenwire.broker import (
    BrokerError,
    Connection,
    PullConsumer,
    StepRecord,
    Topology,
    consumer_state,
)
from tokenwire.services.assembler._assembly import NS, Assembly, ClosedStep, DueStep
from tokenwire.services.assembler._consume import Delivery

log = logging.getLogger(__name__)

Verdict: TypeAlias = Literal["close", "wait", "hand-back", "ask-later"]
MAX_CLAIM_READS = 64


class Unanswered:
    """The broker did not answer a question (a type of its own: None means "no claim")."""


UNANSWERED = Unanswered()


@dataclass(frozen=True, slots=True)
class PartitionView:
    """What the broker says of a partition, for the steps due on it (see the module)."""

    owner: bool
    caught_up: bool


class Claims(Protocol):
    """Reads a step's claim: ``broker.StepClaims``; ``MemoryStepRegistry`` is its twin."""

    async def record(self, session: str, turn: int, step: int) -> StepRecord | None: ...


async def partition_view(
    nc: Connection, topology: Topology, partition: int, consumer: PullConsumer | None, held: int
) -> PartitionView | Unanswered:
    """What the broker says of ``partition`` for this instance, whose ``consumer`` of it holds
    ``held`` unacknowledged messages besides those it buffers: whether its pin is this
    consumer's, and whether nothing of it waits elsewhere (no undelivered message, none
    buffered in the consumer: it may hold the step's next chunk, and no unacknowledged one this
    instance does not hold). ``UNANSWERED`` when the broker did not answer."""
    t = topology
    try:
        state = await consumer_state(
            nc, t.stream_of_partition(partition), t.assembler_consumer(partition)
        )
    except BrokerError as exc:
        log.warning("partition %d: expiry check unanswered: %s", partition, exc)
        return UNANSWERED
    if consumer is None:
        return PartitionView(owner=False, caught_up=False)
    pin = consumer.pin_id
    owner = pin is not None and state.pinned(t.assembler_group) == pin
    caught_up = state.num_pending == 0 and consumer.buffered == 0 and state.num_ack_pending <= held
    return PartitionView(owner, caught_up)


def verdict(
    due: DueStep,
    view: PartitionView | Unanswered,
    claim: StepRecord | Unanswered | None,
    now_ns: int,
) -> Verdict:
    """The decision for one due step (see the module); ``claim`` is only read for an
    ``abandoned`` step."""
    if isinstance(view, Unanswered):
        return "ask-later"
    if not view.owner:
        return "hand-back"
    if not view.caught_up:
        return "wait"
    if due.reason == "gap":
        return "close"
    if isinstance(claim, Unanswered):
        return "ask-later"
    if claim is not None and now_ns < due.last_chunk_ns + int(claim.silence_s() * NS):
        return "wait"
    return "close"


@dataclass
class Expired:
    """What one pass decided: steps to commit, messages to hand back, how many wait."""

    closed: list[ClosedStep[Delivery]] = field(default_factory=list)
    handed_back: list[Delivery] = field(default_factory=list)
    waiting: int = 0


@dataclass
class Expiry:
    """One instance's expiry passes over its Assembly.

    ``view_of(partition)``: the broker's view of a partition (``Unanswered`` when it did
    not answer); ``partition_of(session)``: the session's partition.
    """

    assembly: Assembly[Delivery]
    view_of: Callable[[int], Awaitable[PartitionView | Unanswered]]
    claims: Claims
    partition_of: Callable[[str], int]
    max_claim_reads: int = MAX_CLAIM_READS

    async def run(self, now_ns: int) -> Expired:
        """Decide every due step (see the module), then apply the decisions to the Assembly.

        Nothing is applied before the pass's last question: a step closed while the pass
        still awaited the broker would be closed in the Assembly but not yet with the
        Committer, and a chunk of it arriving meanwhile was settled as a duplicate and
        acknowledged before the step's commit. Applied at the end, such a chunk finds its
        step still open (a new one makes it not due any more: ``close_due``)."""
        decided: list[tuple[DueStep, Verdict]] = []
        views: dict[int, PartitionView | Unanswered] = {}
        reads, answering = 0, True
        for due in self.assembly.due(now_ns):
            partition = self.partition_of(due.key[0])
            if answering and partition not in views:
                views[partition] = await self.view_of(partition)
                answering = isinstance(views[partition], PartitionView)
            view = views.get(partition, UNANSWERED)
            claim: StepRecord | Unanswered | None = UNANSWERED
            if answering and reads < self.max_claim_reads and _needs_claim(due, view):
                reads += 1
                claim = await self._claim(due)
                answering = not isinstance(claim, Unanswered)
            decided.append((due, verdict(due, view, claim, now_ns)))
        out = Expired()
        for due, decision in decided:
            self._apply(due, decision, now_ns, out)
        return out

    async def _claim(self, due: DueStep) -> StepRecord | Unanswered | None:
        try:
            return await self.claims.record(*due.key)
        except BrokerError as exc:
            log.warning("claim of %s/%d/%d unanswered: %s", *due.key, exc)
            return UNANSWERED

    def _apply(self, due: DueStep, decided: Verdict, now_ns: int, out: Expired) -> None:
        match decided:
            case "close":
                closed = self.assembly.close_due(due, now_ns)
                if closed is not None:
                    out.closed.append(closed)
            case "wait":
                self.assembly.touch(due.key, now_ns)
                out.waiting += 1
            case "hand-back":
                out.handed_back += self.assembly.drop_step(due.key)
            case "ask-later":
                out.waiting += 1
            case _:
                assert_never(decided)


def _needs_claim(due: DueStep, view: PartitionView | Unanswered) -> bool:
    """Only an abandoned step on a partition held here and caught up needs its claim."""
    return (
        due.reason == "abandoned"
        and isinstance(view, PartitionView)
        and view.owner
        and (view.caught_up)
    )
