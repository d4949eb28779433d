"""The routes file at work in one gateway (docs/gateway.md, "Routes"): the routes in force
(reloaded when the file changes), the deployments' health (the shared cooldowns, watched),
and a public name's plan with its first pick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from tokenwire.schemas import FailedAttempt
from tokenwire.services.gateway._api.settings import GatewaySettings
from tokenwire.services.gateway._dialects import CallerDialect
from tokenwire.services.gateway._errors import RequestError
from tokenwire.services.gateway._observe.metrics import GatewayMetrics
from tokenwire.services.gateway._routing.attempts import untranslatable
from tokenwire.services.gateway._routing.health import HealthBook
from tokenwire.services.gateway._routing.plan import Candidate, RoutePlan, plan_route
from tokenwire.services.gateway._routing.provider_call import ProviderCall
from tokenwire.services.gateway._routing.routing import Route, resolve
from tokenwire.services.gateway._routing.table import RouteTable
from tokenwire.services.gateway._steps.deps import GatewayDeps

log = logging.getLogger("tokenwire.gateway")


@dataclass
class Routing:
    """A routed request's plan and its first deployment (counted as sent until the step's
    attempts take it over), with the picks before it that could not carry the request."""

    plan: RoutePlan
    first: Candidate
    skipped: list[FailedAttempt] = field(default_factory=list)


class RoutesDesk:
    """The routes, the health book and the reload of one gateway app.

    ``on_reload`` is told the credentials of a reloaded file (the app scrubs them from what
    callers receive). It is the app's view of its deployments for ``/metrics`` too.
    """

    def __init__(
        self,
        settings: GatewaySettings,
        deps: GatewayDeps,
        metrics: GatewayMetrics,
        *,
        rng: random.Random,
        on_reload: Callable[[tuple[str, ...]], None],
    ) -> None:
        self.settings = settings
        self.table = RouteTable(settings.routes, settings.routes_env)
        self.health = HealthBook(deps.cooldowns, clock_ns=deps.clock_ns, monotonic=deps.monotonic)
        self._monotonic = deps.monotonic
        self._metrics = metrics
        self._rng = rng
        self._on_reload = on_reload
        self._reloader: asyncio.Task[None] | None = None
        metrics.watch_deployments(self)

    async def start(self) -> None:
        """With a routes file: watch the shared cooldowns, and the file for changes."""
        if self.table.config is None:
            return
        await self.health.start()
        self._reloader = asyncio.create_task(self._reload(), name="routes file reload")

    async def stop(self) -> None:
        """Stop watching the file and the cooldowns."""
        if self._reloader is not None:
            self._reloader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reloader
        await self.health.stop()

    async def _reload(self) -> None:
        while True:
            await asyncio.sleep(self.settings.routes_reload_s)
            try:
                if self.table.reload_if_changed() and self.table.config is not None:
                    self._on_reload(self.table.config.secrets())
            except Exception:  # a bug's: ended, no later edit of the file would apply
                log.exception("routes: the reload failed (tried again at the next)")

    async def routing(self, model: str, caller: CallerDialect) -> Routing | None:
        """A public name's plan and its first deployment (counted as sent), None for any
        other model; :class:`RouteUnavailableError` (429) when no deployment can take it."""
        if self.table.config is None:
            return None
        plan = plan_route(
            self.table,
            model,
            caller,
            self.health,
            rng=self._rng,
            bounds=self.settings.attempts,
            monotonic=self._monotonic,
        )
        if plan is None:
            return None
        first = await plan.next()
        if first is None:
            self._metrics.route_unavailable.labels(plan.name).inc()
            raise plan.unavailable()
        return Routing(plan, first)

    async def first_call(
        self,
        model: str,
        caller: CallerDialect,
        routing: Routing | None,
        make: Callable[[Route], ProviderCall],
    ) -> ProviderCall:
        """The first call, made by ``make`` for ``provider/model``'s Route or for the plan's
        first pick. A pick that cannot carry the request (a fallback of another dialect,
        picked while the group cools down) is recorded ``untranslatable`` and the plan's next
        is taken, as when a failure reaches it; the last pick's error when none is left."""
        if routing is None:
            return make(resolve(model, caller, self.settings.provider_env))
        while True:
            try:
                return make(routing.first.route)
            except RequestError as exc:
                skipped = untranslatable(routing.first.spec, exc.message)
                following = await routing.plan.next()
                if following is None:
                    raise
                self._metrics.deployment_call(
                    routing.plan.name, skipped.deployment, "untranslatable"
                )
                self.health.done(routing.first.spec)
                routing.skipped.append(skipped)
                routing.first = following

    def unsent(self, routing: Routing | None) -> None:
        """The routed request ended before its step took its first call over."""
        if routing is not None:
            self.health.done(routing.first.spec)

    def deployment_states(self) -> list[tuple[str, str, int]]:
        """(deployment, state, in flight) of the routes in force (``/metrics``)."""
        out: list[tuple[str, str, int]] = []
        for name in self.table.names():
            group = self.table.group(name)
            for d in group.deployments if group is not None else ():
                state = self.health.availability(d.spec)
                out.append((d.spec.name, state, self.health.in_flight(d.spec.name)))
        return out

    def routes_reloads(self) -> tuple[int, int]:
        """Routes file reloads applied and refused (``/metrics``)."""
        return self.table.reloads, self.table.reload_errors
