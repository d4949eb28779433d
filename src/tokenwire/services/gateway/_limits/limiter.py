"""Admission: whether a key's call may start under its own and its tenant's limits and
budgets, and what it used once it ended (docs/gateway.md, "Limits and budgets"; ADR 0042).

:meth:`Limiter.admit` takes, for each scope (the key, its tenant) with limits: the minute's
tokens (checked), a budget reservation (the call's worst-case cost), a stream slot and one
request of the minute, each from this gateway's lease (``leases.py``); a refusal gives back
what it took and raises :class:`RateLimitedError` or :class:`BudgetExceededError`. The
:class:`Admission` it returns is ended once with the step's usage and cost: the slot comes
back, the reservation settles to the cost, the tokens count. A background loop
(:meth:`Limiter.run`) writes spend and tokens, gives back surplus and renews holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from decimal import Decimal

from tokenwire.broker import AllowanceBoard, BrokerError
from tokenwire.ledger import PICO_PER_USD, to_usd
from tokenwire.schemas import NO_LIMITS, Budget, Limits
from tokenwire.services.gateway._access.keys import Caller
from tokenwire.services.gateway._errors import (
    BrokerUnavailableError,
    BudgetExceededError,
    RateLimitedError,
)
from tokenwire.services.gateway._limits.leases import Held, LeaseContext, WindowCount, WindowTokens
from tokenwire.services.gateway._limits.periods import budget_period, minute_of, openai_duration

log = logging.getLogger("tokenwire.gateway.limits")

FLUSH_S = 0.2
"""How often the leases are looked at (each writes when it is due; at once when kicked)."""


@dataclass(frozen=True)
class Scope:
    """One side of a caller that has limits: ``kind`` ``key`` or ``tenant``, and its name."""

    kind: str
    name: str
    limits: Limits
    budget_pusd: int = 0

    @property
    def counter(self) -> str:
        """Its counters' key part: ``key.agent``, ``tenant.acme``."""
        return f"{self.kind}.{self.name}"


def scopes_of(caller: Caller) -> tuple[Scope, ...]:
    """The caller's key and its tenant, each when it has any limit."""
    found = []
    if caller.name is not None and caller.limits != NO_LIMITS:
        found.append(_scope("key", caller.name, caller.limits))
    if caller.tenant is not None and caller.tenant_limits != NO_LIMITS:
        found.append(_scope("tenant", caller.tenant, caller.tenant_limits))
    return tuple(found)


def _scope(kind: str, name: str, limits: Limits) -> Scope:
    budget = limits.budget
    pusd = int(Decimal(budget.usd) * PICO_PER_USD) if budget is not None else 0
    return Scope(kind, name, limits, pusd)


class _Scopes:
    """The scopes of the callers seen lately, by the caller object (a key ring's callers are
    the same objects request after request; bounded)."""

    def __init__(self, bound: int = 4096) -> None:
        self._known: dict[int, tuple[Caller, tuple[Scope, ...]]] = {}
        self._bound = bound

    def of(self, caller: Caller) -> tuple[Scope, ...]:
        known = self._known.get(id(caller))
        if known is not None and known[0] is caller:
            return known[1]
        if len(self._known) >= self._bound:
            self._known.clear()
        scopes = scopes_of(caller)
        self._known[id(caller)] = (caller, scopes)
        return scopes


@dataclass
class Admission:
    """What one admitted call took; :meth:`end` gives it back once."""

    limiter: Limiter
    held: list[tuple[Held, int, bool]] = field(default_factory=list)  # (lease, amount, budget)
    tokens: list[WindowTokens] = field(default_factory=list)
    requests: list[tuple[WindowCount, int]] = field(default_factory=list)  # (lease, minute)
    ended: bool = False

    def end(self, *, tokens: int, cost_pusd: int | None) -> None:
        """The call ended having used ``tokens`` and cost ``cost_pusd`` (None: unknown,
        charged its whole reservation)."""
        if self.ended:
            return
        self.ended = True
        window, _ = minute_of(self.limiter.clock_ns() / 1e9)
        for counter in self.tokens:
            counter.add(window, tokens)
        exact = False
        for lease, amount, budget in self.held:
            spent = (amount if cost_pusd is None else cost_pusd) if budget else 0
            lease.give_back(amount, spent)
            exact = exact or lease.exact
        if exact:  # near a limit: what it held goes back at once
            self.limiter.kick()

    def release(self) -> None:
        """The call never started: everything back, nothing spent."""
        if not self.ended:
            self.ended = True
            for lease, amount, _ in self.held:
                lease.give_back(amount)
            for count, window in self.requests:
                count.give_back(window)
            self.limiter.kick()


class Limiter:
    """One gateway's side of the fleet's limits (one per app)."""

    def __init__(
        self,
        board: AllowanceBoard,
        *,
        clock_ns: Callable[[], int],
        hold_ttl_s: float,
        on_refusal: Callable[[str, str], None] = lambda kind, scope: None,
        on_trip: Callable[[float], None] = lambda seconds: None,
    ) -> None:
        self.clock_ns = clock_ns
        self.ctx = LeaseContext(board, uuid.uuid4().hex[:12], clock_ns, hold_ttl_s)
        self._counts: dict[str, WindowCount] = {}
        self._tokens: dict[str, WindowTokens] = {}
        self._held: dict[str, Held] = {}
        self._wake = asyncio.Event()
        self._scopes = _Scopes()
        self._on_refusal = on_refusal
        self._on_trip = on_trip

    def limits(self, caller: Caller) -> bool:
        """Whether ``caller``'s key or tenant has any limit."""
        return bool(self._scopes.of(caller))

    def kick(self) -> None:
        """Flush soon (a lease near its limit gives back at once)."""
        self._wake.set()

    async def admit(self, caller: Caller, reservation: Callable[[], int] | None) -> Admission:
        """Admit one call of ``caller`` or raise the refusal; ``reservation`` gives the call's
        worst-case cost in pico-USD (asked only under a budget; it raises for an unpriced
        model)."""
        admission = Admission(self)
        priced: list[int] = []

        def once() -> int:  # the key's and the tenant's budgets reserve the same amount
            if not priced and reservation is not None:
                priced.append(reservation())
            return priced[0]

        try:
            for scope in self._scopes.of(caller):
                await self._admit_scope(scope, admission, once if reservation else None)
        except BaseException:
            admission.release()
            raise
        return admission

    async def _admit_scope(
        self, scope: Scope, admission: Admission, reservation: Callable[[], int] | None
    ) -> None:
        limits, now_s = scope.limits, self.clock_ns() / 1e9
        window, reset_s = minute_of(now_s)
        if limits.tpm is not None:
            tokens = self._lease_tokens(scope, limits.tpm)
            if not tokens.admits(window):
                self._refuse(scope, "tpm", limits, reset_s)
            admission.tokens.append(tokens)
        if limits.budget is not None and reservation is not None:
            await self._reserve(scope, limits.budget, reservation(), admission, now_s)
        if limits.concurrent is not None:
            slots = self._lease_held(f"conc.{scope.counter}", limits.concurrent, False)
            if not await self._take(slots, 1):
                self._refuse(scope, "concurrent", limits, 1.0)
            admission.held.append((slots, 1, False))
        if limits.rpm is not None:
            count = self._lease_count(scope, limits.rpm)
            taken = count.take_now(window)
            if taken is None:
                taken = await self._asked(count.take(self.ctx, window))
            if not taken:
                self._refuse(scope, "rpm", limits, reset_s)
            admission.requests.append((count, window))

    async def _asked(self, take: Coroutine[object, object, bool]) -> bool:
        """Await a take that asks the board (timed; a broker error is a 503)."""
        started = self.ctx.clock_ns()
        try:
            return await take
        except BrokerError as exc:
            raise BrokerUnavailableError(
                "the limits could not be checked", detail=str(exc)
            ) from exc
        finally:
            self._on_trip((self.ctx.clock_ns() - started) / 1e9)

    async def _take(self, lease: Held, amount: int) -> bool:
        margin = int(self.ctx.hold_ttl_s * 1e9 / 3)
        if lease.take_now(amount, self.ctx.clock_ns(), margin):
            return True
        return await self._asked(lease.take(self.ctx, amount))

    async def _reserve(
        self, scope: Scope, budget: Budget, pusd: int, admission: Admission, now_s: float
    ) -> None:
        period, resets = budget_period(budget.period, now_s)
        lease = self._lease_held(f"usd.{scope.counter}.{period}", scope.budget_pusd, True)
        if not await self._take(lease, pusd):
            self._on_refusal("budget", scope.kind)
            seconds = max(1, int(resets.timestamp() - now_s))
            left = lease.remaining()
            raise BudgetExceededError(
                f"the {_ADJECTIVE[budget.period]} budget of {scope.kind} {scope.name} "
                f"(${budget.usd} per UTC {budget.period}) cannot cover this call's reservation of "
                f"${_usd(pusd)} (its input and max_tokens at the model's price): ${_usd(left)} "
                f"left; it resets at {resets.isoformat().replace('+00:00', 'Z')}",
                scope=scope.kind,
                retry_after_s=seconds,
            )
        admission.held.append((lease, pusd, True))

    def _refuse(self, scope: Scope, kind: str, limits: Limits, reset_s: float) -> None:
        self._on_refusal(kind, scope.kind)
        limit = {"rpm": limits.rpm, "tpm": limits.tpm, "concurrent": limits.concurrent}[kind]
        what = {"rpm": "requests per minute", "tpm": "tokens per minute"}.get(kind, "streams")
        retry = max(1, int(-(-reset_s // 1)))
        raise RateLimitedError(
            f"{scope.kind} {scope.name} is at its limit of {limit} {what}; retry after {retry} s",
            kind=kind,
            scope=scope.kind,
            retry_after_s=retry,
            headers=self.headers(scope, refused=kind, reset_s=reset_s),
        )

    def headers(self, scope: Scope, *, refused: str, reset_s: float) -> dict[str, str]:
        """OpenAI's ``x-ratelimit-*`` headers for ``scope`` (its requests and tokens)."""
        limits, out = scope.limits, dict[str, str]()
        reset = openai_duration(reset_s)
        if limits.rpm is not None:
            count = self._lease_count(scope, limits.rpm)
            left = 0 if refused == "rpm" else count.remaining()
            out |= _rate_headers("requests", limits.rpm, left, reset)
        if limits.tpm is not None:
            tokens = self._lease_tokens(scope, limits.tpm)
            left = 0 if refused == "tpm" else tokens.remaining()
            out |= _rate_headers("tokens", limits.tpm, left, reset)
        return out

    # -- leases -------------------------------------------------------------------------

    def _lease_count(self, scope: Scope, limit: int) -> WindowCount:
        key = f"rpm.{scope.counter}"
        lease = self._counts.get(key)
        if lease is None or lease.limit != limit:
            lease = self._counts[key] = WindowCount(key, limit)
        return lease

    def _lease_tokens(self, scope: Scope, limit: int) -> WindowTokens:
        key = f"tpm.{scope.counter}"
        lease = self._tokens.get(key)
        if lease is None:
            lease = self._tokens[key] = WindowTokens(key, limit)
        lease.limit = limit
        return lease

    def _lease_held(self, key: str, limit: int, budget: bool) -> Held:
        lease = self._held.get(key)
        if lease is None:
            lease = self._held[key] = Held(key, limit, charge_expired=budget)
        lease.limit = limit
        return lease

    # -- the background flush ----------------------------------------------------------

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The background flush while the block runs; then everything held is given back."""
        task = asyncio.create_task(self.run(), name="limits flush")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await self.close()

    async def run(self) -> None:
        """Flush every :data:`FLUSH_S` or when kicked, until cancelled. An error a flush lets
        out is logged and the next flush tries again: ended, this loop would stop writing
        tokens, spend and give backs, and renewing holds that other gateways then clear."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(FLUSH_S):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.flush()
            except Exception:
                log.exception("limits: the flush failed (tried again at the next)")

    async def flush(self) -> None:
        """Write spend and tokens, give back surplus, renew holds; a broker error is logged
        and tried again at the next flush (holds end by their TTL meanwhile)."""
        now = self.clock_ns()
        window, _ = minute_of(now / 1e9)
        try:
            for tokens in list(self._tokens.values()):  # a new scope may come meanwhile
                if tokens.due(window, now):
                    await tokens.flush(self.ctx, window)
            for lease in list(self._held.values()):
                if lease.due(now, self.ctx.hold_ttl_s):
                    await lease.flush(self.ctx)
        except BrokerError as exc:
            log.warning("limits: could not write the shared counters (tried again): %s", exc)

    async def close(self) -> None:
        """Give everything held back (a stopping gateway), bounded by the broker's answers."""
        for lease in self._held.values():
            lease.in_use = 0
        await self.flush()

    def leases(self) -> dict[str, int]:
        """What this gateway holds, by counter (for the metrics)."""
        return {k: v.hold for k, v in self._held.items()}


_ADJECTIVE = {"day": "daily", "month": "monthly"}


def _rate_headers(what: str, limit: int, remaining: int, reset: str) -> dict[str, str]:
    return {
        f"x-ratelimit-limit-{what}": str(limit),
        f"x-ratelimit-remaining-{what}": str(remaining),
        f"x-ratelimit-reset-{what}": reset,
    }


def _usd(pusd: int) -> str:
    """pico-USD as dollars, at most 6 decimals, rounded up (never understated)."""
    micro = -(-pusd // 1_000_000)
    return f"{to_usd(micro * 1_000_000).normalize():f}"
