"""Whether the telemetry consumer can do its job, and why not: ``/readyz`` and the
``tokenwire_telemetry_ready`` / ``_not_ready{reason}`` gauges (issue 48).

:func:`assess` is pure. The consumer is not ready, for each of these reasons (a closed set):

- ``disconnected``: no connection to the broker;
- ``broker``: connected, but no poll of its consumers answered for three poll periods (e.g.
  JetStream still loading its streams after a restart);
- ``missing``: a ``telemetry`` consumer (or its chunk stream) is missing on the broker and
  could not be created again (``broker.Restorer``; ``tokenwire provision``);
- ``lag``: first chunks have waited longer than :data:`READY_MAX_LAG_S` without a delivery:
  stream-started signals fall behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias, get_args

NotReady: TypeAlias = Literal["disconnected", "broker", "missing", "lag"]
REASONS: tuple[NotReady, ...] = get_args(NotReady)

READY_MAX_LAG_S = 60.0
"""First chunks waiting this long without a delivery make the consumer not ready: the
assembler's default bound (``TOKENWIRE_ASSEMBLER_READY_MAX_LAG_S``)."""


@dataclass(frozen=True, slots=True)
class Facts:
    """What the consumer knows: ``poll_age_s`` since every shard's consumer last answered
    (None: never), ``waited_s`` the longest wait of undelivered first chunks, ``missing``
    the objects the broker said are missing and that are not back."""

    connected: bool
    poll_age_s: float | None
    poll_s: float
    waited_s: float
    missing: frozenset[str] = frozenset()
    max_lag_s: float = READY_MAX_LAG_S


@dataclass(frozen=True, slots=True)
class Readiness:
    """The verdict: the reasons it is not ready (none: ready) and a line for people."""

    reasons: tuple[NotReady, ...]
    detail: str

    @property
    def ready(self) -> bool:
        return not self.reasons

    def body(self) -> str:
        return f"{'ready' if self.ready else 'not ready'}: {self.detail}\n"


NOT_STARTED = Readiness(("broker",), "broker: not polled yet")


def assess(f: Facts) -> Readiness:
    """The readiness of a consumer that knows ``f``."""
    found: dict[NotReady, str] = {}
    if not f.connected:
        found["disconnected"] = "no connection to the broker"
    elif f.poll_age_s is None or f.poll_age_s > 3 * f.poll_s:
        age = "ever" if f.poll_age_s is None else f"{f.poll_age_s:.0f} s"
        found["broker"] = f"no consumer poll answered for {age}"
    if f.missing:
        found["missing"] = "missing on the broker: " + ", ".join(sorted(f.missing)[:4])
    if f.waited_s > f.max_lag_s:
        found["lag"] = f"first chunks waited {f.waited_s:.0f} s (bound {f.max_lag_s:g} s)"
    reasons = tuple(r for r in REASONS if r in found)
    detail = "; ".join(f"{r}: {found[r]}" for r in reasons)
    return Readiness(reasons, detail or "consuming every shard's first chunks")
