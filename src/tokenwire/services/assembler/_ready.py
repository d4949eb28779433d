"""Whether an assembler instance can do its job, and why not: the ``/readyz`` answer and the
``tokenwire_assembler_ready`` / ``_not_ready{reason}`` gauges (issue 48).

:func:`assess` is pure: the service gathers what it knows (every second, and after each lag
poll) into :class:`Facts` and gets a :class:`Readiness` whose reasons come from a closed set
(:data:`REASONS`: bounded metric labels): ``starting``, ``disconnected``, ``broker``,
``store``, ``membership``, ``missing``, ``unowned``, ``lag``. What each means:
docs/assembler.md, "Readiness".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeAlias, get_args

NotReady: TypeAlias = Literal[
    "starting", "disconnected", "broker", "store", "membership", "missing", "unowned", "lag"
]
REASONS: tuple[NotReady, ...] = get_args(NotReady)


@dataclass(frozen=True, slots=True)
class Facts:
    """What the instance knows at one moment (see the module for how each is used).

    - ``poll_age_s``: since the last lag poll every partition answered (None: never);
    - ``beat_age_s`` / ``read_age_s``: since the last heartbeat stored / membership read
      answered (None: never);
    - ``owned``: partitions this instance holds the pin of;
    - ``work``: partition -> whether messages wait on it, as last polled;
    - ``others``: partitions another live member reports holding;
    - ``waited_s``: partition -> seconds its undelivered messages have waited without a
      delivery, as last polled;
    - ``missing``: objects the broker said are missing and that are not back;
    - ``held_since_poll``: this instance held a partition after the last poll answered.
    """

    started: bool
    connected: bool
    store_ok: bool
    partitions: int
    owned: frozenset[int]
    poll_age_s: float | None
    lag_poll_s: float
    beat_age_s: float | None
    read_age_s: float | None
    member_ttl_s: float
    max_lag_s: float
    work: Mapping[int, bool] = field(default_factory=dict)
    others: frozenset[int] = frozenset()
    waited_s: Mapping[int, float] = field(default_factory=dict)
    missing: frozenset[str] = frozenset()
    held_since_poll: bool = False


@dataclass(frozen=True, slots=True)
class Readiness:
    """The verdict: ready, or the reasons it is not (in :data:`REASONS` order), and a line
    for people (the ``/readyz`` body)."""

    reasons: tuple[NotReady, ...]
    detail: str

    @property
    def ready(self) -> bool:
        return not self.reasons

    def body(self) -> str:
        return f"{'ready' if self.ready else 'not ready'}: {self.detail}\n"


NOT_STARTED = Readiness(("starting",), "not started")


def assess(f: Facts) -> Readiness:
    """The readiness of an instance that knows ``f``."""
    found: dict[NotReady, str] = {}
    if not f.started:
        found["starting"] = "not started"
    if not f.connected:
        found["disconnected"] = "no connection to the broker"
    elif f.poll_age_s is None or f.poll_age_s > 3 * f.lag_poll_s:
        found["broker"] = "the broker answered no lag poll for " + _age(f.poll_age_s)
    if not f.store_ok:
        found["store"] = "the last store call failed"
    membership = _membership(f)
    if membership:
        found["membership"] = membership
    if f.missing:
        found["missing"] = "missing on the broker: " + ", ".join(sorted(f.missing)[:4])
    unowned = _unowned(f)
    if unowned:
        shown = ", ".join(map(str, unowned[:8]))
        found["unowned"] = f"partitions with messages waiting have no owner ({shown})"
    elif not f.owned and f.held_since_poll:
        found["unowned"] = "it lost its partitions since the last lag poll"
    lagging = {p: s for p, s in f.waited_s.items() if p in f.owned and s > f.max_lag_s}
    if lagging:
        worst = max(lagging, key=lambda p: lagging[p])
        found["lag"] = (
            f"partition {worst}'s messages waited {lagging[worst]:.0f} s for a delivery "
            f"(bound {f.max_lag_s:g} s)"
        )
    owns = f"owns {len(f.owned)} of {f.partitions} partitions"
    reasons = tuple(r for r in REASONS if r in found)
    detail = "; ".join(f"{r}: {found[r]}" for r in reasons)
    return Readiness(reasons, f"{owns}; {detail}" if detail else owns)


def _membership(f: Facts) -> str:
    if f.beat_age_s is None or f.beat_age_s > f.member_ttl_s:
        return "no heartbeat stored for " + _age(f.beat_age_s)
    if f.read_age_s is None or f.read_age_s > f.member_ttl_s:
        return "no membership read answered for " + _age(f.read_age_s)
    return ""


def _unowned(f: Facts) -> list[int]:
    """Partitions with messages waiting and no owner, when this instance owns none."""
    if f.owned:
        return []
    return sorted(p for p, waiting in f.work.items() if waiting and p not in f.others)


def _age(seconds: float | None) -> str:
    return "ever" if seconds is None else f"{seconds:.0f} s"
