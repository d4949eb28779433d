"""Leases: the slices of a shared allowance one gateway holds, so that most admissions are
decided in memory and the counters stay exact across the fleet (ADR 0042).

- :class:`WindowCount` (requests per minute): a refill adds a slice to the minute's ``used``
  by compare-and-set, never past the limit; the gateway admits from its slice. What a gateway
  leased and did not use is lost with the minute (never over, maybe under).
- :class:`WindowTokens` (tokens per minute): admitted while the minute's tokens as this
  gateway last saw them, plus its own not yet written, are under the limit; a step's tokens
  are added when it ends and written within a second (at once near the limit). The
  overshoot is at most the tokens of the steps already admitted when the limit was reached.
- :class:`Held` (concurrent streams, budgets): the gateway holds an amount (``Hold``) with an
  end; what it admits comes out of it. While plenty is free it holds a slice more than it
  uses; near the limit it holds exactly what it uses (a broker round trip per take and per
  give back). A hold not renewed by its end is another gateway's to clear: a stream slot is
  dropped, a budget hold is charged in full (a dead gateway's spend is never lost).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from tokenwire.broker import AllowanceBoard, Hold, Pool

SLICE_SHARE = 8
"""A refill takes at most this fraction of what is free."""
PLENTY = 64
"""A held allowance is leased in slices only while more than this many takes are free."""
WINDOW_TTL_S = 180.0
"""How long a minute's counters stay in the bucket (the minute and two more)."""


@dataclass(frozen=True)
class LeaseContext:
    """What every lease of one gateway shares: the board, the gateway's id, its clock (Unix
    ns) and how long a hold lasts unless renewed."""

    board: AllowanceBoard
    gateway: str
    clock_ns: Callable[[], int]
    hold_ttl_s: float


class WindowCount:
    """Requests of one scope per fixed minute (``<key>.<minute>`` in the bucket)."""

    def __init__(self, key: str, limit: int) -> None:
        self.key, self.limit = key, limit
        self.window = -1
        self.left = 0  # leased, not yet used
        self.seen = 0  # the minute's used, as last written or read
        self._exhausted = False
        self._lock = asyncio.Lock()

    def _roll(self, window: int) -> None:
        if window != self.window:
            self.window, self.left, self.seen, self._exhausted = window, 0, 0, False

    def take_now(self, window: int) -> bool | None:
        """True: taken from the slice; False: the minute is used up; None: ask the board."""
        self._roll(window)
        if self.left > 0:
            self.left -= 1
            return True
        return False if self._exhausted else None

    async def take(self, ctx: LeaseContext, window: int) -> bool:
        """One request of ``window``: from the slice, else from a new slice."""
        if (now := self.take_now(window)) is not None:
            return now
        async with self._lock:
            if (now := self.take_now(window)) is not None:
                return now
            granted = 0

            def grant(pool: Pool) -> Pool | None:
                nonlocal granted
                free = self.limit - pool.used
                granted = max(1, free // SLICE_SHARE) if free > 0 else 0
                return Pool(pool.used + granted, pool.holds) if granted else None

            pool = await ctx.board.update(f"{self.key}.{window}", grant, ttl_s=WINDOW_TTL_S)
            if window != self.window:
                return granted > 0  # the minute ended while asking: this one only
            self.seen = pool.used
            if not granted:
                self._exhausted = True
                return False
            self.left += granted - 1
            return True

    def give_back(self, window: int) -> None:
        """A request taken in ``window`` that did not start: its slot is this gateway's again."""
        if window == self.window:
            self.left += 1

    def remaining(self) -> int:
        """What the fleet may still admit this minute, as this gateway knows it."""
        return max(0, self.limit - self.seen) + self.left


class WindowTokens:
    """Tokens (input + output) of one scope per fixed minute."""

    def __init__(self, key: str, limit: int) -> None:
        self.key, self.limit = key, limit
        self.window = -1
        self.seen = 0
        self.pending: dict[int, int] = {}  # tokens by minute, not yet written
        self.read_ns = 0  # when the minute's total was last read
        self._lock = asyncio.Lock()

    def _roll(self, window: int) -> None:
        if window != self.window:
            self.window, self.seen = window, 0

    def admits(self, window: int) -> bool:
        """Whether the minute's tokens, as known here, are under the limit."""
        self._roll(window)
        return self.seen + self.pending.get(window, 0) < self.limit

    def add(self, window: int, tokens: int) -> None:
        """A step's tokens, counted in the minute it ended in (which may have had no
        admission yet: the total read back after they are written is that minute's)."""
        if tokens > 0:
            if window > self.window:  # never back to an earlier minute (a clock set back)
                self._roll(window)
            self.pending[window] = self.pending.get(window, 0) + tokens

    def remaining(self) -> int:
        return max(0, self.limit - self.seen - self.pending.get(self.window, 0))

    def due(self, window: int, now_ns: int) -> bool:
        """Written and read back once a second while the minute is in use, at once when its
        known total nears the limit (the fleet's other tokens show sooner)."""
        near = self.seen + sum(self.pending.values()) >= self.limit * 7 // 8
        used = bool(self.pending) or window == self.window
        return used and (near or now_ns - self.read_ns >= 10**9)

    async def flush(self, ctx: LeaseContext, window: int) -> None:
        """Write the pending tokens, and read the minute's total back."""
        self.read_ns = ctx.clock_ns()
        async with self._lock:
            for minute, tokens in sorted(self.pending.items()):

                def added(pool: Pool, n: int = tokens) -> Pool:
                    return Pool(pool.used + n, pool.holds)

                pool = await ctx.board.update(f"{self.key}.{minute}", added, ttl_s=WINDOW_TTL_S)
                # a step that ended while this was written added to the minute: it stays
                if left := self.pending.pop(minute) - tokens:
                    self.pending[minute] = left
                if minute == self.window:
                    self.seen = pool.used
            if window == self.window and not self.pending:
                self.seen = (await ctx.board.read(f"{self.key}.{window}")).used


class Held:
    """An allowance this gateway holds part of: streams now, or pico-USD of a budget period
    (``charge_expired``: a hold that ended unrenewed is spent, not freed)."""

    def __init__(self, key: str, limit: int, *, charge_expired: bool) -> None:
        self.key, self.limit, self.charge_expired = key, limit, charge_expired
        self.hold = 0  # what the board says this gateway holds
        self.in_use = 0  # taken and not given back (streams, or reservations)
        self.spent = 0  # given back as spent, not yet written (budgets)
        self.until_ns = 0
        self.exact = True  # the hold is exactly what is in use: give back at once
        self.seen_used = 0
        self.seen_held = 0  # what the other gateways held at the last write
        self._writing = False  # a write is on its way: the hold may be about to shrink
        self._lock = asyncio.Lock()

    def take_now(self, amount: int, now_ns: int, margin_ns: int) -> bool:
        """Take ``amount`` from the hold, if it covers it and does not end too soon, and no
        write is on its way (it sets the hold to what was in use when it was computed: a take
        meanwhile would be outside the hold the others see; it waits for the write)."""
        if self._writing:
            return False
        if self.hold - self.in_use - self.spent >= amount and self.until_ns - margin_ns > now_ns:
            self.in_use += amount
            return True
        return False

    async def take(self, ctx: LeaseContext, amount: int) -> bool:
        """Take ``amount``: from the hold, else from a larger one; False when the allowance
        cannot cover it (nothing taken)."""
        margin = int(ctx.hold_ttl_s * 1e9 / 3)
        if self.take_now(amount, ctx.clock_ns(), margin):
            return True
        async with self._lock:
            if self.take_now(amount, ctx.clock_ns(), margin):
                return True
            if not await self._write(ctx, wanted=amount):
                return False
            self.in_use += amount
            return True

    def give_back(self, amount: int, spent: int = 0) -> None:
        """``amount`` taken is back; ``spent`` of it was spent for good (a settled cost, which
        may exceed the reservation: it is counted whole)."""
        self.in_use -= amount
        self.spent += spent

    def due(self, now_ns: int, ttl_s: float) -> bool:
        """Whether a flush has something to write: near the limit, spend or a surplus at
        once; with a slice, its renewal (spend rides along) or spend past half of it."""
        if self.hold == 0 and self.spent == 0:
            return False
        surplus = self.hold - self.in_use - self.spent
        renew = self.until_ns - now_ns < ttl_s * 1e9 * 2 / 3
        if self.exact:  # near the limit: spend and surplus go back at once
            return self.spent > 0 or surplus > 0 or renew
        return renew or self.spent * 2 >= self.hold  # a slice: written with its renewal

    async def flush(self, ctx: LeaseContext) -> None:
        """Write what was spent, give back what is not used, renew the hold."""
        async with self._lock:
            await self._write(ctx, wanted=0)

    def remaining(self) -> int:
        """What the fleet may still take, as this gateway knows it."""
        return max(0, self.limit - self.seen_used - self.seen_held - self.in_use - self.spent)

    async def _write(self, ctx: LeaseContext, *, wanted: int) -> bool:
        """One compare-and-set of the pool: clear ended holds, add this gateway's spend, and
        hold what is in use (and spend it has not added) plus ``wanted`` (and a slice while
        plenty is free). False (the hold left as it was) when the allowance cannot cover
        ``wanted``."""
        now = ctx.clock_ns()
        until = now + int(ctx.hold_ttl_s * 1e9)
        spent, me = self.spent, ctx.gateway
        outcome: dict[str, int] = {}
        written: list[int] = []  # the hold each change computed wrote for this gateway

        def change(pool: Pool) -> Pool | None:
            used, holds = self._cleared(pool, now, me)
            # this gateway's hold charged in full by another (it ended unrenewed): its spend
            # is in that charge
            lost = me not in pool.holds and self.hold > 0 and self.charge_expired
            add = 0 if lost else spent
            others = sum(h.amount for g, h in holds.items() if g != me)
            free = self.limit - used - add - others
            # computed after the read: spend given back since ``spent`` was taken is not in
            # ``add``, so the hold keeps it until the next write adds it
            need = self.in_use + self.spent - spent + wanted
            if wanted and free < need:
                outcome.clear()
                return Pool(used, holds) if (used, holds) != (pool.used, pool.holds) else None
            extra = _slice(free - need, max(wanted, 1)) if wanted else 0
            hold = need + extra
            outcome.update(hold=hold, extra=extra, used=used + add, others=others)
            written.append(hold)
            rest = {g: h for g, h in holds.items() if g != me}
            if hold > 0:
                rest[me] = Hold(hold, until)
            return Pool(used + add, rest)

        self._writing = True
        try:
            pool = await ctx.board.update(self.key, change, ttl_s=_held_ttl(ctx.hold_ttl_s))
        except BaseException:
            # a write whose answer was lost may have applied: the board holds the old hold or
            # one written, and takes count only on the smallest
            self.hold = min([self.hold, *written])
            raise
        finally:
            self._writing = False
        self.seen_used = pool.used
        if not outcome:
            self.seen_held = pool.held(now_ns=now, but=me)
            return False
        self.spent -= spent
        self.hold, self.until_ns, self.exact = outcome["hold"], until, outcome["extra"] == 0
        self.seen_held = outcome["others"]
        return True

    def _cleared(self, pool: Pool, now_ns: int, me: str) -> tuple[int, dict[str, Hold]]:
        """The pool without the other gateways' ended holds (charged when spend)."""
        used, holds = pool.used, {}
        for gateway, hold in pool.holds.items():
            if gateway != me and hold.until_ns <= now_ns:
                used += hold.amount if self.charge_expired else 0
            else:
                holds[gateway] = hold
        return used, holds


def _slice(free: int, amount: int) -> int:
    """What a refill holds beyond its need: a share of what is free while plenty is."""
    return free // SLICE_SHARE if free > PLENTY * amount else 0


def _held_ttl(hold_ttl_s: float) -> float:
    """A held pool stays in the bucket while any hold of it might: budgets are rewritten by
    every spend, so this only ends a pool nobody touched for a long time."""
    return max(hold_ttl_s * 4, 40 * 86400.0)
