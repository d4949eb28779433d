"""The fair-share arithmetic (pure): shares add up, surplus goes cheapest first, views converge."""

from __future__ import annotations

import random

import pytest

from tokenwire.services.assembler._shares import allot, balanced, plan, shares


@pytest.mark.parametrize(("partitions", "members"), [(16, 1), (16, 2), (16, 3), (16, 5), (4, 6)])
def test_shares_add_up_to_the_partitions_and_differ_by_at_most_one(
    partitions: int, members: int
) -> None:
    names = [f"m{i}" for i in range(members)]
    got = shares(partitions, names)
    assert sum(got.values()) == partitions
    assert max(got.values()) - min(got.values()) <= 1
    assert max(got.values()) == -(-partitions // members)  # ceil(P / N)


def test_every_member_computes_the_same_shares_whatever_order_it_lists_them_in() -> None:
    names = ["c", "a", "b"]
    assert shares(16, names) == shares(16, list(reversed(names))) == {"a": 6, "b": 5, "c": 5}


def test_the_surplus_handed_over_is_the_least_in_flight() -> None:
    in_flight = {p: 0 for p in range(8)} | {3: 50, 5: 7, 6: 1}
    decision = plan(8, ["a", "b"], "a", in_flight)
    assert decision.share == 4
    assert decision.release == (0, 1, 2, 4)  # 3, 5 and 6 hold the most
    assert not decision.offer


def test_a_member_below_its_share_offers_and_one_at_it_stays_out() -> None:
    assert plan(16, ["a", "b"], "b", {p: 0 for p in range(3)}).offer
    assert not plan(16, ["a", "b"], "b", {p: 0 for p in range(8)}).offer


def test_a_member_missing_from_its_own_view_still_counts_itself() -> None:
    assert plan(16, ["a"], "b", {}).share == 8


def test_on_a_stack_nobody_holds_each_member_stands_by_for_exactly_its_share() -> None:
    """Nothing pinned yet (an idle stack that never carried traffic): one standby per
    partition, each member standing by for as many as its share (issue 30: the first
    delivery must not pick among several)."""
    for members in range(1, 7):
        names = [f"m{i}" for i in range(members)]
        got = allot(16, {n: {} for n in names})
        assert {n: len(ps) for n, ps in got.items()} == shares(16, names)
        assert sorted(p for ps in got.values() for p in ps) == list(range(16))


def test_the_surplus_an_owner_hands_over_is_allotted_to_the_members_below_their_share() -> None:
    holdings = {"a": {p: 5 for p in range(16)} | {3: 0, 9: 0}, "b": {}, "c": {}}
    released = plan(16, sorted(holdings), "a", holdings["a"]).release
    assert len(released) == 10
    assert {3, 9} <= set(released)  # the cheapest go first
    got = allot(16, holdings)
    assert got["a"] == ()
    assert (len(got["b"]), len(got["c"])) == (5, 5)
    assert sorted(got["b"] + got["c"]) == list(released)


def test_the_allotment_stays_put_while_its_partitions_get_pinned() -> None:
    """Partitions pinned where they were allotted, in any order, leave every other member's
    allotment as it was (the members' views agree during the first burst after a join)."""
    rng = random.Random(7)
    for _ in range(100):
        names = [f"m{i}" for i in range(rng.randint(1, 5))]
        holdings: dict[str, dict[int, int]] = {n: {} for n in names}
        first = allot(16, holdings)
        owner = {p: n for n, ps in first.items() for p in ps}
        for p in rng.sample(range(16), 16):
            holdings[owner[p]][p] = 0
            now = allot(16, holdings)
            for n in names:
                assert set(now[n]) <= set(first[n]), (n, now, first)


def test_surplus_only_moves_to_members_below_their_share_until_balanced() -> None:
    """A simulation of the rules with the server's role played by a pick among the members
    standing by for a partition that nobody holds: from any start (some partitions pinned at
    random, the rest free), balance is reached and nothing moves afterwards; every partition
    pinned once the allotment is in place goes where the shares want it."""
    rng = random.Random(3)
    for _ in range(200):
        names = [f"m{i}" for i in range(rng.randint(1, 6))]
        owner: dict[int, str | None] = {
            p: rng.choice([*names, None]) for p in range(16)
        }  # None: not pinned (an idle partition, or one released earlier)
        moves = 0
        for _round in range(50):
            holdings = {n: {p: 0 for p, o in owner.items() if o == n} for n in names}
            released = [p for n in names for p in plan(16, names, n, holdings[n]).release]
            standby = allot(16, holdings)
            for p in released:
                owner[p] = None
                moves += 1
            for n, ps in standby.items():
                for p in ps:
                    owner[p] = n  # the one standby for p gets its next message's pin
            if not released and None not in owner.values():
                break
        counts = {n: sum(1 for o in owner.values() if o == n) for n in names}
        assert balanced(16, counts), counts
        assert moves <= 16
