"""The membership loop: heartbeat, read the live members, keep this instance at its fair share.

Every ``heartbeat_s``: write this instance's heartbeat, read every live member's, compute the
shares (``_shares.py``), then act on this instance only: hand over the surplus (the owner
pauses its pulls on a partition, waits for that partition's closed steps to commit, bounded,
then releases the pin with ``$JS.API.CONSUMER.UNPIN``), and stand by for the partitions the
allotment gives it while it holds less than its share (every member computes the same
allotment, so a free partition has one standby and its next message pins it there). The
server still decides who is pinned. ADR 0016, ADR 0026.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tokenwire.services.assembler._consume import PartitionSet
from tokenwire.services.assembler._members import MemberBoard, MemberRecord
from tokenwire.services.assembler._metrics import AssemblerMetrics
from tokenwire.services.assembler._shares import allot, balanced, plan

log = logging.getLogger(__name__)


@dataclass
class Rebalancer:
    """One instance's side of the elastic shares. :meth:`round` is one heartbeat period.

    - ``in_flight(p)``: messages of partition ``p`` this instance holds unacknowledged.
    - ``hand_over(p)``: pause, wait for ``p``'s commits (bounded), release its pin.
    - ``hold_s``: after handing ``p`` over, do not stand by for it for this long (the next
      owner is pinned meanwhile; no ping-pong of one partition between two views); a
      membership change ends every hold (the shares it protected are gone).
    - ``orphan_rounds``: a partition no live member reports holding or standing by for, this
      many rounds in a row, is stood by for by everyone, whatever the shares say (views
      disagree, so the allotment gave it to nobody).
    """

    board: MemberBoard
    partitions: PartitionSet
    name: str
    count: int
    metrics: AssemblerMetrics
    in_flight: Callable[[int], int]
    hand_over: Callable[[int], Awaitable[None]]
    hold_s: float = 10.0
    orphan_rounds: int = 3
    clock: Callable[[], float] = time.monotonic
    share: int = 0
    members: dict[str, MemberRecord] = field(default_factory=dict)
    _view: frozenset[str] = field(default_factory=frozenset)
    _changed_at: float | None = None
    _held_until: dict[int, float] = field(default_factory=dict)
    _unheld: dict[int, int] = field(default_factory=dict)
    _standby: frozenset[int] = field(default_factory=frozenset)
    beat_ok_at: float | None = None
    """``clock()`` of the last heartbeat the bucket stored (None: never)."""
    read_ok_at: float | None = None
    """``clock()`` of the last membership read answered (None: never)."""

    @property
    def standby(self) -> frozenset[int]:
        """The partitions the last round's allotment gave this member to stand by for."""
        return self._standby

    async def beat(self) -> bool:
        """Write this instance's heartbeat, unless a partition's pull loop has died (then the
        broker expires it and the others take over). Runs on its own period, never behind a
        hand-over, so a busy round cannot make a live member expire."""
        if not self.partitions.healthy():
            log.warning("a partition loop died: no heartbeat, the others take over")
            return False
        stored = await self.board.beat(self._record())
        if stored:
            self.beat_ok_at = self.clock()
        return stored

    async def round(self) -> None:
        """Read, decide, act. The hand-overs run concurrently (each bounded by its wait)."""
        mine = self._record()
        members = await self.board.read()
        if members is None:
            if not self._view or self._unread_s() > self.hold_s:
                # never had a view, or none for longer than the member TTL (the others count
                # this instance gone; a broker that lost the bucket): stand by everywhere, as
                # without shares, so no partition stays without an owner; the server still
                # pins one client per partition, and the shares resume with the next view
                for consumer in self.partitions.consumers.values():
                    consumer.offering = True
            return  # no answer: keep the last view, decide nothing this round
        self.read_ok_at = self.clock()
        members[self.name] = mine
        self.members = members
        self._note_view(frozenset(members))
        decision = plan(self.count, sorted(members), self.name, mine.in_flight)
        self.share = decision.share
        self._offer(members)
        await asyncio.gather(*(self.hand_over(p) for p in decision.release))
        for partition in decision.release:
            self._held_until[partition] = self.clock() + self.hold_s
        self._observe(members)

    def _unread_s(self) -> float:
        """Seconds since the last membership read answered (infinite: never)."""
        return float("inf") if self.read_ok_at is None else self.clock() - self.read_ok_at

    def _record(self) -> MemberRecord:
        pins = self.partitions.pins()
        return MemberRecord(
            name=self.name,
            share=self.share,
            pins=pins,
            in_flight={p: self.in_flight(p) for p in pins},
            standby=sorted(self._standby),
        )

    def _offer(self, members: dict[str, MemberRecord]) -> None:
        """Stand by for the partitions allotted to this member, and for orphans."""
        holdings = {n: {p: r.in_flight.get(p, 0) for p in r.pins} for n, r in members.items()}
        self._standby = frozenset(allot(self.count, holdings)[self.name])
        covered = {p for n, r in members.items() if n != self.name for p in (*r.pins, *r.standby)}
        covered |= {*members[self.name].pins, *self._standby}
        now = self.clock()
        for p, consumer in self.partitions.consumers.items():
            self._unheld[p] = 0 if p in covered else self._unheld.get(p, 0) + 1
            wanted = p in self._standby or self._unheld[p] >= self.orphan_rounds
            consumer.offering = wanted and now >= self._held_until.get(p, 0.0)

    def _note_view(self, view: frozenset[str]) -> None:
        if view != self._view:
            if self._view:
                log.info("members now %s (were %s)", sorted(view), sorted(self._view))
            self._view = view
            self._changed_at = self.clock()
            self._held_until.clear()  # the shares changed: an old hold protects nothing

    def _observe(self, members: dict[str, MemberRecord]) -> None:
        """Export the view; time the change to balanced ownership once it is reached."""
        self.metrics.members.set(len(members))
        self.metrics.share.set(self.share)
        self.metrics.owned_partitions.set(members[self.name].owned)
        ok = balanced(self.count, {n: r.owned for n, r in members.items()})
        self.metrics.balanced.set(1 if ok else 0)
        since = self._changed_at
        if since is None:
            self.metrics.unbalanced_seconds.set(0)
        elif ok:
            self.metrics.rebalance_seconds.observe(self.clock() - since)
            self.metrics.unbalanced_seconds.set(0)
            self._changed_at = None
        else:
            self.metrics.unbalanced_seconds.set(self.clock() - since)
