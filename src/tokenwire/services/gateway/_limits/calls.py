"""One model call's side of the limits: its admission before it is sent, and what settles it
when its step ends (the app calls these two; ``limiter.py`` does the counting)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tokenwire.schemas import DeploymentPrice, Routed, TokenUsage
from tokenwire.services.gateway._access.keys import Caller
from tokenwire.services.gateway._limits.limiter import Admission, Limiter
from tokenwire.services.gateway._limits.reservation import (
    output_cap,
    reservation_pusd,
    settled_cost,
)
from tokenwire.services.gateway._routing.routing import Route

Target = tuple[str, str, DeploymentPrice | None]
"""A deployment a call may reach: its provider, upstream model and own price (if any)."""
Settle = Callable[[TokenUsage | None, Route, Routed | None, bool], None]


async def admit_call(
    limiter: Limiter,
    caller: Caller,
    *,
    body: Mapping[str, Any],
    body_bytes: int,
    targets: Sequence[Target],
    default_cap: int,
    at_ns: int,
) -> Admission | None:
    """The call's admission under its key's and tenant's limits, or the refusal (None:
    neither has any). Its reservation is its worst case at the dearest of ``targets`` (the
    deployments its attempts may reach, fallbacks included: a fallback never settles above
    what was reserved), from the body's length (``body_bytes``) and its output cap
    (``default_cap`` when it set none)."""
    if not limiter.limits(caller):
        return None
    cap = output_cap(body, default_cap)

    def reservation() -> int:
        return max(
            reservation_pusd(
                provider, model, price=price, input_bound=body_bytes, output_cap=cap, at_ns=at_ns
            )
            for provider, model, price in targets
        )

    return await limiter.admit(caller, reservation)


def settler(admission: Admission | None, at_ns: int) -> Settle | None:
    """What settles ``admission`` when its step ends: the ledger's cost of the usage reported;
    nothing spent for a call that ended before any chunk without usage; its whole reservation
    for one that streamed without a cost (no usage reported, or no price for it)."""
    if admission is None:
        return None

    def ended(
        usage: TokenUsage | None, route: Route, routed: Routed | None, streamed: bool
    ) -> None:
        if usage is None and not streamed:
            admission.end(tokens=0, cost_pusd=0)
            return
        cost = settled_cost(route.provider, route.model, usage, at_ns, routed)
        admission.end(tokens=usage.total() if usage is not None else 0, cost_pusd=cost.pusd)

    return ended
