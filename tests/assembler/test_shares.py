"""The fair-share arithmetic (pure): shares add up, surplus goes cheapest first, views converge."""

from __future__ import annotations

import random

import pytest

from tokenwire.services.assembler._shares import balanced, plan, shares


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


def test_surplus_only_moves_to_members_below_their_share_until_balanced() -> None:
    """A simulation of the rules with the server's role played by a random pick among the
    members that offer: from any start, balance is reached and nothing moves afterwards."""
    rng = random.Random(3)
    for _ in range(200):
        names = [f"m{i}" for i in range(rng.randint(1, 6))]
        owner = {p: rng.choice(names) for p in range(16)}
        moves = 0
        for _round in range(50):
            held = {n: [p for p, o in owner.items() if o == n] for n in names}
            offering = [n for n in names if plan(16, names, n, dict.fromkeys(held[n], 0)).offer]
            released = [
                p for n in names for p in plan(16, names, n, dict.fromkeys(held[n], 0)).release
            ]
            for p in released:
                owner[p] = rng.choice(offering)
                moves += 1
            if not released:
                break
        counts = {n: sum(1 for o in owner.values() if o == n) for n in names}
        assert balanced(16, counts), counts
        assert moves <= 16
