"""The order a routed request tries its deployments in (docs/gateway.md, "Routes").

A request's :class:`RoutePlan` walks its group's deployments, then each declared fallback's,
in the order the routes file names them (fallbacks are not followed further). Within a group
each attempt picks one of the deployments not tried yet that can take a request now (not
cooling down, not probed by another gateway, not at capacity), by the group's strategy:

- **weighted** (the default): at random with probability ``weight_i / sum(weights)`` of those
  left, so a healthy group shares its requests by weight and a fallback within the group is a
  weighted pick among the others;
- **least-in-flight**: fewest requests in flight on this gateway, the weighted pick among
  equals.

A deployment whose cooldown ended is picked like any other; the pick then claims its one
probe, and one that loses the claim is skipped. Only what an attempt needs is computed when
it is made: the first pick costs one random draw. The plan stops after ``max_attempts`` calls
or once ``max_wait_s`` passed since the first.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from tokenwire import variables
from tokenwire.schemas import FailedAttempt, Routed
from tokenwire.services.gateway._dialects.base import CallerDialect
from tokenwire.services.gateway._errors import RouteUnavailableError
from tokenwire.services.gateway._routing.health import Availability, HealthBook
from tokenwire.services.gateway._routing.routes_file import DeploymentSpec, HealthPolicy
from tokenwire.services.gateway._routing.routing import Route
from tokenwire.services.gateway._routing.table import Deployment, Group, RouteTable


@dataclass(frozen=True, slots=True)
class Candidate:
    """One deployment a request may be sent to, with its Route for the caller's dialect, its
    spec (name, provider, model, price...) and its group's health policy."""

    deployment: Deployment
    route: Route
    spec: DeploymentSpec
    policy: HealthPolicy


@dataclass(frozen=True, slots=True)
class AttemptBounds:
    """How far one routed step goes before its first byte: at most ``max_attempts`` calls,
    none started later than ``max_wait_s`` after the first."""

    max_attempts: int = variables.ROUTES_MAX_ATTEMPTS.value
    max_wait_s: float = variables.ROUTES_MAX_WAIT_S.value


class RoutePlan:
    """One request's attempts, picked one at a time (see the module)."""

    def __init__(
        self,
        table: RouteTable,
        group: Group,
        caller: CallerDialect,
        health: HealthBook,
        *,
        rng: random.Random,
        bounds: AttemptBounds,
        monotonic: Callable[[], float],
    ) -> None:
        self.name = group.name
        self._table = table
        self._fallbacks = group.spec.fallbacks
        self._caller = caller
        self._health = health
        self._rng = rng
        self._bounds = bounds
        self._monotonic = monotonic
        self._deadline = 0.0  # set by the first attempt
        self._group = 0  # how many of the fallbacks were entered
        self._left = list(group.deployments)
        self.tried = 0
        self.skipped: list[tuple[Deployment, Availability]] = []

    async def next(self) -> Candidate | None:
        """The next deployment to send to (counted as sent), None when none is left within
        the bounds."""
        if self.tried >= self._bounds.max_attempts:
            return None
        if self.tried and self._monotonic() >= self._deadline:
            return None
        while True:
            picked = self._pick()
            if picked is None:
                if not self._enter_fallback():
                    return None
                continue
            deployment, availability = picked
            if availability == "probe" and not await self._health.claim_probe(
                deployment.spec, deployment.group.health
            ):
                self.skipped.append((deployment, "probing"))
                continue
            if not self.tried:
                self._deadline = self._monotonic() + self._bounds.max_wait_s
            self.tried += 1
            self._health.sent(deployment.spec)
            route = deployment.routes[self._caller]
            return Candidate(deployment, route, deployment.spec, deployment.group.health)

    def _pick(self) -> tuple[Deployment, Availability] | None:
        """One of the deployments left in the current group by its strategy (removed from
        those left); the ones that cannot take a request now are skipped."""
        usable: list[tuple[Deployment, Availability]] = []
        for deployment in self._left:
            availability = self._health.availability(deployment.spec)
            if availability in ("ok", "probe"):
                usable.append((deployment, availability))
            else:
                self.skipped.append((deployment, availability))
        if not usable:
            self._left = []
            return None
        if len(usable) > 1 and usable[0][0].group.strategy == "least-in-flight":
            fewest = min(self._health.in_flight(d.spec.name) for d, _ in usable)
            usable = [u for u in usable if self._health.in_flight(u[0].spec.name) == fewest]
        chosen = usable[0] if len(usable) == 1 else self._weighted(usable)
        self._left = [d for d, _ in usable if d is not chosen[0]]
        return chosen

    def _weighted(
        self, usable: list[tuple[Deployment, Availability]]
    ) -> tuple[Deployment, Availability]:
        point = self._rng.random() * sum(d.weight for d, _ in usable)
        for entry in usable:
            point -= entry[0].weight
            if point < 0:
                return entry
        return usable[-1]

    def _enter_fallback(self) -> bool:
        """Go on with the next declared fallback group; False when none is left."""
        while self._group < len(self._fallbacks):
            group = self._table.group(self._fallbacks[self._group])
            self._group += 1
            if group is not None:
                self._left = list(group.deployments)
                return True
        return False

    def reachable(self) -> list[DeploymentSpec]:
        """Every deployment an attempt of this plan may still go to (the current group's and
        every fallback group's not entered yet): a budget reserves the dearest of them."""
        specs = [d.spec for d in self._left]
        for name in self._fallbacks[self._group :]:
            group = self._table.group(name)
            if group is not None:
                specs.extend(d.spec for d in group.deployments)
        return specs

    def may_go_on(self) -> bool:
        """Whether a failure now could still be followed by another attempt."""
        return (
            (bool(self._left) or self._group < len(self._fallbacks))
            and self.tried < self._bounds.max_attempts
            and self._monotonic() < self._deadline
        )

    def first_byte_timeout_s(self, candidate: Candidate) -> float | None:
        """How long ``candidate`` may take to its first token before the next is tried (its
        group's bound, within the plan's deadline); None when nothing would follow it."""
        if not self.may_go_on():
            return None
        left = self._deadline - self._monotonic()
        return max(0.001, min(candidate.policy.first_byte_timeout_s, left))

    def unavailable(self) -> RouteUnavailableError:
        """The answer when no deployment could take the request at all."""
        waits = [
            self._health.capacity_left_s(d.spec.name)
            if availability == "busy"
            else self._health.cooling_left_s(d.spec.name)
            for d, availability in self.skipped
        ]
        kinds = sorted({availability for _, availability in self.skipped})
        retry = max(1, int(min(waits, default=1.0) + 0.999))
        return RouteUnavailableError(self.name, retry_after_s=retry, why=", ".join(kinds))

    def routed(self, candidate: Candidate, attempts: list[FailedAttempt]) -> Routed:
        """What the step's first chunk says of its route."""
        return Routed(self.name, candidate.spec.name, list(attempts), candidate.spec.price)


def plan_route(
    table: RouteTable,
    name: str,
    caller: CallerDialect,
    health: HealthBook,
    *,
    rng: random.Random,
    bounds: AttemptBounds,
    monotonic: Callable[[], float],
) -> RoutePlan | None:
    """The plan for a public name, None when ``name`` is not one."""
    group = table.group(name)
    if group is None:
        return None
    return RoutePlan(table, group, caller, health, rng=rng, bounds=bounds, monotonic=monotonic)
