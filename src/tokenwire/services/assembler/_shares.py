"""Fair shares of the partitions among the live assemblers: a pure function (ADR 0016).

Every instance computes the same targets from the same membership view: with ``P`` partitions
and ``N`` live members (sorted by name), the first ``P mod N`` members' share is
``ceil(P / N)`` and the others' ``floor(P / N)``, so the shares add up to ``P`` exactly. An
instance decides only about itself: holding more than its share it hands the surplus over
(the partitions with the fewest messages in flight first), holding fewer it offers itself as
a standby; holding its share it stays out, except for a partition nobody has held for a while
(an orphan: its owner died and the membership has not caught up yet).

>>> shares(16, ["a", "b", "c"])
{'a': 6, 'b': 5, 'c': 5}
>>> plan(16, ["a", "b", "c"], "a", {p: 100 - p for p in range(16)}).release
(6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


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
    and whether it stands by for partitions it does not hold."""

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


def balanced(partitions: int, owned: Mapping[str, int]) -> bool:
    """Whether every member holds exactly its share (``owned``: member -> partitions held)."""
    return shares(partitions, list(owned)) == dict(owned)
