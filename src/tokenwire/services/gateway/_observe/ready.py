"""Whether the gateway can do its job, and why not: ``/readyz`` and the
``tokenwire_gateway_ready`` / ``_not_ready{reason}`` gauges (issue 48).

A gateway is not ready, for each of these reasons (a closed set: bounded labels):

- ``disconnected``: no connection to the broker;
- ``broker``: connected, but a chunk stream or registry bucket did not answer its info request
  (JetStream still loading its streams after a restart, a leader election);
- ``stream-missing``: the broker says a chunk stream does not exist: chunks of its partitions
  cannot be captured (``tokenwire provision``; a gateway that provisions does it again);
- ``registry-missing``: the broker says a step-registry bucket does not exist: steps of its
  sessions cannot be claimed (likewise);
- ``publish-stalled``: a chunk has waited longer than :data:`PUBLISH_STALL_S` for its ack: the
  broker takes no chunks (each step still ends acked or failed within the publisher's bounds);
- ``keys-stale``: the keys bucket is not read, or its watch is behind: a key revoked now may
  still be accepted here (the gateway keeps the keys it had and watches again; ADR 0041).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, TypeAlias, get_args

NotReady: TypeAlias = Literal[
    "disconnected", "broker", "stream-missing", "registry-missing", "publish-stalled", "keys-stale"
]
REASONS: tuple[NotReady, ...] = get_args(NotReady)

PUBLISH_STALL_S = 10.0
"""The oldest unacknowledged chunk's wait past which the gateway is not ready: five of the
publisher's resends (every 2 s) without an ack, well past a leader election's usual few
seconds, well inside its 30 s horizon."""


@dataclass(frozen=True, slots=True)
class Readiness:
    """The verdict: the reasons it is not ready (in :data:`REASONS` order; none: ready) and
    what each concerns."""

    reasons: tuple[NotReady, ...] = ()
    detail: str = ""

    @property
    def ready(self) -> bool:
        return not self.reasons

    def adding(self, reason: NotReady, detail: str) -> Readiness:
        """This verdict with one more reason (in :data:`REASONS` order)."""
        reasons = tuple(r for r in REASONS if r in self.reasons or r == reason)
        text = "; ".join(x for x in (self.detail, f"{reason}: {detail}") if x)
        return Readiness(reasons, text)

    def body(self) -> dict[str, Any]:
        """The ``/readyz`` JSON body."""
        if self.ready:
            return {"status": "ready"}
        return {"status": "not ready", "reasons": list(self.reasons), "detail": self.detail}


READY = Readiness()


def readiness_of(found: dict[NotReady, list[str]]) -> Readiness:
    """The verdict for what was found wrong (reason -> what it concerns)."""
    reasons = tuple(r for r in REASONS if found.get(r))
    detail = "; ".join(f"{r}: {', '.join(found[r][:4])}" for r in reasons)
    return Readiness(reasons, detail)
