"""The assembler's readiness verdict (``_ready.assess``): each reason on its own, an idle
instance owning nothing is ready, and the body names what it owns and why it is not ready."""

from __future__ import annotations

import dataclasses

import pytest

from tokenwire.services.assembler._ready import REASONS, Facts, assess

HEALTHY = Facts(
    started=True,
    connected=True,
    store_ok=True,
    partitions=4,
    owned=frozenset({0, 1}),
    poll_age_s=1.0,
    lag_poll_s=5.0,
    beat_age_s=0.5,
    read_age_s=0.5,
    member_ttl_s=6.0,
    max_lag_s=60.0,
    work={0: True, 1: False, 2: True, 3: False},
    others=frozenset({2}),
    waited_s={0: 0.2},
)


def test_a_healthy_instance_is_ready_and_says_what_it_owns() -> None:
    verdict = assess(HEALTHY)
    assert verdict.ready
    assert verdict.body() == "ready: owns 2 of 4 partitions\n"


def test_an_idle_instance_owning_nothing_is_ready() -> None:
    """No partition has messages waiting: a partition is pinned with its next message."""
    idle = dataclasses.replace(HEALTHY, owned=frozenset(), work={p: False for p in range(4)})
    assert assess(idle).ready


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"started": False}, "starting"),
        ({"connected": False}, "disconnected"),
        ({"poll_age_s": None}, "broker"),
        ({"poll_age_s": 15.1}, "broker"),
        ({"store_ok": False}, "store"),
        ({"beat_age_s": 6.5}, "membership"),
        ({"beat_age_s": None}, "membership"),
        ({"read_age_s": 7.0}, "membership"),
        ({"missing": frozenset({"assembler-p3"})}, "missing"),
        ({"owned": frozenset()}, "unowned"),  # partition 0 has messages and no owner
        ({"waited_s": {0: 61.0}}, "lag"),
    ],
)
def test_each_reason_on_its_own(change: dict[str, object], reason: str) -> None:
    verdict = assess(dataclasses.replace(HEALTHY, **change))  # type: ignore[arg-type]  # a case's fields, mixed types
    assert verdict.reasons == (reason,)
    assert not verdict.ready
    assert verdict.body().startswith("not ready: owns ")
    assert f"; {reason}: " in verdict.body()


def test_losing_every_partition_after_the_last_poll_is_not_ready_until_a_poll_vouches() -> None:
    """A broker restart drops every pin: the last poll (from before) cannot say nothing
    waits unowned now."""
    idle = {p: False for p in range(4)}
    dropped = dataclasses.replace(HEALTHY, owned=frozenset(), work=idle, held_since_poll=True)
    assert assess(dropped).reasons == ("unowned",)
    vouched = dataclasses.replace(dropped, held_since_poll=False)  # polled since: all idle
    assert assess(vouched).ready


def test_owning_nothing_is_fine_while_others_own_every_partition_with_work() -> None:
    covered = dataclasses.replace(HEALTHY, owned=frozenset(), others=frozenset({0, 2}))
    assert assess(covered).ready


def test_a_lagging_partition_held_elsewhere_is_not_this_instance_s_lag() -> None:
    assert assess(dataclasses.replace(HEALTHY, waited_s={2: 600.0})).ready


def test_reasons_come_in_one_order_and_are_a_closed_set() -> None:
    everything = dataclasses.replace(
        HEALTHY,
        started=False,
        connected=False,
        store_ok=False,
        beat_age_s=None,
        missing=frozenset({"x"}),
        owned=frozenset(),
    )
    verdict = assess(everything)
    assert verdict.reasons == (
        "starting",
        "disconnected",
        "store",
        "membership",
        "missing",
        "unowned",
    )
    assert set(verdict.reasons) <= set(REASONS)
    assert len(REASONS) == 8
