"""Fair shares of the partitions among the live assemblers: pure functions (ADR 0016, 0026).

Every instance computes the same targets from the same membership view: with ``P`` partitions
and ``N`` live members (sorted by name), the first ``P mod N`` members' share is
``ceil(P / N)`` and the others' ``floor(P / N)``, so the shares add up to ``P`` exactly. An
instance decides only about itself: holding more than its share it hands the surplus over
(the partitions with the fewest messages in flight first); holding fewer it stands by for the
partitions :func:`allot` names for it, so that every partition nobody will hold has exactly
one standby and the server pins it to that member with its next message (ADR 0026); holding
its share it stays out, except for a partition nobody holds or stands by for (an orphan: views
disagree, or its owner died and the membership has not caught up yet).

>>> shares(16, ["a", "b", "c"])
{'a': 6, 'b': 5, 'c': 5}
>>> plan(16, ["a", "b", "c"], "a", {p: 100 - p for p in range(16)}).release
(6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
>>> allot(16, {"a": {p: 0 for p in range(16)}, "b": {}, "c": {}})
{'a': (), 'b': (0, 1, 2, 3, 4), 'c': (5, 6, 7, 8, 9)}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import islice


def shares(partitions: int, members: Sequence[str]) -> dict[str, int]:
    """Each member's share: ``ceil(P/N)`` for the first ``P mod N`` names, else ``floor``."""
    ordered = sorted(set(members))
    if not ordered:
        return {}
    base, extra = divmod(partitions, len(ordered))
    return {name: base + (1 if i < extra else 0) for i, name in enumerate(ordered)}


@dataclass(frozen=True, slots=True)
class Plan:
    """What one member does this round: its share, which of its partitions it hands over,
    and whether it is below its share (and so stands by for what :func:`allot` gives it)."""

    share: int
    release: tuple[int, ...]
    offer: bool


def plan(partitions: int, members: Sequence[str], me: str, in_flight: Mapping[int, int]) -> Plan:
    """This member's round. ``in_flight``: per partition it holds, the messages it holds
    unacknowledged (the cheapest to hand over have the fewest). ``me`` always counts as live.
    """
    share = shares(partitions, [*members, me])[me]
    surplus = len(in_flight) - share
    if surplus <= 0:
        return Plan(share, (), offer=surplus < 0)
    cheapest = sorted(in_flight, key=lambda p: (in_flight[p], p))[:surplus]
    return Plan(share, tuple(sorted(cheapest)), offer=False)


def allot(partitions: int, holdings: Mapping[str, Mapping[int, int]]) -> dict[str, tuple[int, ...]]:
    """Who stands by for which partition: one member per partition that nobody will hold.

    ``holdings``: every live member -> the partitions it holds -> messages in flight there
    (its heartbeat). The partitions nobody holds, plus those the members above their share
    are handing over (:func:`plan` predicts which), are dealt out in partition order to the
    members below their share, in name order, each getting as many as it lacks. Every member
    computes the same answer from the same view, so each free partition has one standby, and
    the server's pin (given with the partition's next message) lands where the shares want it.
    Without this every member below its share stood by everywhere and the first delivery
    picked among them at random (issue 30: a first burst split 0.60 / 0.31 / 0.09).
    """
    names = sorted(holdings)
    target = shares(partitions, names)
    held = {p for owned in holdings.values() for p in owned}
    releasing = {p for n in names for p in plan(partitions, names, n, holdings[n]).release}
    free = iter(sorted((set(range(partitions)) - held) | releasing))
    return {n: tuple(islice(free, max(0, target[n] - len(holdings[n])))) for n in names}


def balanced(partitions: int, owned: Mapping[str, int]) -> bool:
    """Whether every member holds exactly its share (``owned``: member -> partitions held)."""
    return shares(partitions, list(owned)) == dict(owned)
