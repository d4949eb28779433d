"""Limits and budgets of keys and tenants on one in-process gateway (the broker's memory twin of
the allowances bucket), and the leases' arithmetic over one board shared by several gateways.

Oracles: the limits written in the keys file; the ledger's price function for the budget
(genai-prices, independent of the limiter); the openai and anthropic SDKs for what a client
reads of a refusal. Across gateways, docs/gateway.md, "Limits and budgets": the real test is
tests/gateway/test_limits_real.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from typing import Any, Literal

import anthropic
import openai
import pytest

from tests.gateway._helpers import Rig, make_rig, recording
from tokenwire.broker import MemoryAllowances, MemorySessionOwners, RequestFailed
from tokenwire.ledger import price_step
from tokenwire.schemas import TokenUsage
from tokenwire.services.gateway import parse_keys
from tokenwire.services.gateway._limits.calls import admit_call
from tokenwire.services.gateway._limits.leases import (
    Held,
    LeaseContext,
    WindowCount,
    WindowTokens,
)
from tokenwire.services.gateway._limits.limiter import Limiter
from tokenwire.services.gateway._limits.periods import budget_period, openai_duration

KEY = "limited-key-SENTINEL-91"
BODY = recording("openai/chat-text-include-usage.sse")
ANTHROPIC_BODY = recording("anthropic/messages-text-short.sse")
MESSAGES: Any = [{"role": "user", "content": "What is the capital of Mexico?"}]


def rig_with(limits: str, tenant: str = "", answer: bytes = BODY) -> Rig:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    text = f'[[keys]]\nname = "agent"\nsha256 = "{digest}"\ntenant = "acme"\nlimits = {limits}\n'
    if tenant:
        text += f'[[tenants]]\nname = "acme"\nlimits = {tenant}\n'
    named = parse_keys(text.encode())
    return make_rig(answer, owners=MemorySessionOwners(), keys=frozenset(), named_keys=named)


def client(rig: Rig) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url="http://127.0.0.1/v1",
        api_key=KEY,
        http_client=rig.client(),  # type: ignore[arg-type]
        max_retries=0,
    )


async def call(sdk: openai.AsyncOpenAI, model: str = "openai/gpt-4o", **extra: Any) -> None:
    stream = await sdk.chat.completions.create(model=model, messages=MESSAGES, stream=True, **extra)
    async for _ in stream:
        pass


async def test_a_key_at_3_rpm_gets_3_calls_then_429s_the_openai_sdk_reads() -> None:
    sdk = client(rig_with("{ rpm = 3 }"))
    for _ in range(3):
        await call(sdk)
    with pytest.raises(openai.RateLimitError) as refused:
        await call(sdk)
    headers = refused.value.response.headers
    assert headers["x-ratelimit-limit-requests"] == "3"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"] == "10s"  # the pinned clock is 50 s in
    assert headers["retry-after"] == "10"
    assert refused.value.code == "rate_limit_error"
    assert "agent is at its limit of 3 requests per minute" in refused.value.message


async def test_the_tenants_limit_is_shared_and_a_refusal_takes_nothing_from_the_key() -> None:
    rig = rig_with("{ rpm = 5 }", tenant="{ rpm = 2 }")
    sdk = client(rig)
    await call(sdk)
    await call(sdk)
    for _ in range(3):
        with pytest.raises(openai.RateLimitError, match="tenant acme"):
            await call(sdk)
    assert len(rig.upstream.requests) == 2


async def test_tokens_per_minute_admit_until_the_reported_tokens_reach_the_limit() -> None:
    sdk = client(rig_with("{ tpm = 30 }"))
    await call(sdk)  # 22 tokens reported (14 in, 8 out)
    await call(sdk)  # 22 < 30 when admitted: the overshoot the docs state (44)
    with pytest.raises(openai.RateLimitError) as refused:
        await call(sdk)
    assert refused.value.response.headers["x-ratelimit-limit-tokens"] == "30"
    assert refused.value.response.headers["x-ratelimit-remaining-tokens"] == "0"


async def test_an_anthropic_caller_gets_anthropics_rate_limit_error() -> None:
    rig = rig_with("{ rpm = 1 }", answer=ANTHROPIC_BODY)
    sdk = rig.anthropic().with_options(api_key=KEY)
    ask: Any = {"model": "anthropic/claude-sonnet-4-5", "max_tokens": 16, "messages": MESSAGES}
    await sdk.messages.create(**ask)
    with pytest.raises(anthropic.RateLimitError) as refused:
        await sdk.messages.create(**ask)
    assert refused.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert refused.value.response.headers["retry-after"] == "10"


def reservation(max_tokens: int, body_bytes: int) -> int:
    usage = TokenUsage(input_tokens=body_bytes, output_tokens=max_tokens)
    cost = price_step("openai", "gpt-4o", usage, 0).pusd
    assert cost is not None
    return cost


async def test_a_budget_refuses_the_call_whose_reservation_would_cross_it() -> None:
    exact = price_step("openai", "gpt-4o", TokenUsage(input_tokens=14, output_tokens=8), 0).pusd
    assert exact == 115_000_000  # 14 x $2.50/M + 8 x $10/M
    # each call reserves its worst case (about 3.4 times its cost) and settles to its cost
    rig = rig_with('{ budget = { usd = "0.001", period = "day" } }')
    sdk = client(rig)
    admitted, error = await until_refused(sdk)
    assert error.code == "insufficient_quota"
    assert error.response.headers["x-should-retry"] == "false"
    assert "daily budget of key agent ($0.001 per UTC day)" in error.message
    assert "resets at 2023-11-15T00:00:00Z" in error.message
    spent = admitted * exact
    assert spent <= 1_000_000_000
    # the refusal came when the next reservation did not fit, not before
    assert 1_000_000_000 - spent < reservation(8, _body_bytes())
    assert admitted == 6
    # and what the limiter counted is the ledger's exact cost of every call
    [lease] = rig.app.state.gateway.limiter._held.values()
    board = rig.app.state.gateway.limiter.ctx.board
    assert isinstance(board, MemoryAllowances)
    assert (lease.in_use, board.pools_by_key[lease.key].used + lease.spent) == (0, spent)


async def until_refused(sdk: openai.AsyncOpenAI) -> tuple[int, openai.RateLimitError]:
    """Calls until the first refusal: how many were admitted, and the refusal."""
    for admitted in range(20):
        try:
            await call(sdk, max_tokens=8)
        except openai.RateLimitError as exc:
            return admitted, exc
    raise AssertionError("never refused")


def _body_bytes() -> int:
    """The canonical body length the gateway reserved the input for (the caller's JSON)."""
    import msgspec

    body = {"model": "openai/gpt-4o", "messages": MESSAGES, "stream": True, "max_tokens": 8}
    return len(msgspec.json.encode(body, order="sorted"))


async def test_an_unpriced_model_is_refused_under_a_budget_with_the_reason() -> None:
    sdk = client(rig_with('{ budget = { usd = "1" } }'))
    with pytest.raises(openai.BadRequestError, match="cannot be called under a budget"):
        await call(sdk, model="scripted/text")


async def test_concurrent_streams_are_limited_and_come_back_when_a_stream_ends() -> None:
    rig = rig_with("{ concurrent = 2 }")
    rig.upstream.pause_s = 0.05
    sdk = client(rig)
    results = await asyncio.gather(*(call(sdk) for _ in range(5)), return_exceptions=True)
    refused = [r for r in results if isinstance(r, openai.RateLimitError)]
    assert len(refused) == 3
    assert "limit of 2 streams" in str(refused[0])
    await call(sdk)  # the slots came back


# -- leases over one board, several gateways -----------------------------------------------


def contexts(board: MemoryAllowances, count: int, now: list[int]) -> list[LeaseContext]:
    return [LeaseContext(board, f"g{i}", lambda: now[0], 15.0) for i in range(count)]


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_three_gateways_never_admit_more_than_the_minutes_requests(seed: int) -> None:
    print(f"seed={seed}")
    rng = random.Random(seed)
    board = MemoryAllowances()
    ctxs = contexts(board, 3, [0])
    counts = [WindowCount("rpm.key.a", 100) for _ in ctxs]
    admitted = 0
    for _ in range(1000):
        i = rng.randrange(3)
        admitted += await counts[i].take(ctxs[i], 7)
    assert admitted == 100  # every gateway kept being asked: no slice was left unused
    assert board.pools_by_key["rpm.key.a.7"].used == 100


async def test_held_streams_across_gateways_never_exceed_the_limit_and_a_dead_ones_expire() -> None:
    board = MemoryAllowances()
    now = [10**18]
    ctxs = contexts(board, 2, now)
    leases = [Held("conc.key.a", 3, charge_expired=False) for _ in ctxs]
    assert await leases[0].take(ctxs[0], 1)
    assert await leases[0].take(ctxs[0], 1)
    assert await leases[1].take(ctxs[1], 1)
    assert not await leases[1].take(ctxs[1], 1)  # 3 in use across both
    # gateway 0 dies holding two; past its hold's end gateway 1 may take them
    now[0] += 16 * 10**9
    assert await leases[1].take(ctxs[1], 1)
    assert await leases[1].take(ctxs[1], 1)
    assert not await leases[1].take(ctxs[1], 1)


async def test_a_dead_gateways_budget_hold_is_charged_in_full() -> None:
    board = MemoryAllowances()
    now = [10**18]
    ctxs = contexts(board, 2, now)
    leases = [Held("usd.key.a.2026-12-07", 1000, charge_expired=True) for _ in ctxs]
    assert await leases[0].take(ctxs[0], 300)  # reserved, then the gateway dies
    now[0] += 16 * 10**9
    assert await leases[1].take(ctxs[1], 700)
    assert not await leases[1].take(ctxs[1], 1)
    assert board.pools_by_key["usd.key.a.2026-12-07"].used == 300  # charged, never freed


class PausingBoard(MemoryAllowances):
    """The memory twin with one change held on its way (``pause_next``), as a broker round
    trip holds it: ``"write"`` once the change is computed and stored (its answer on its way),
    ``"read"`` before it is computed (the key's last message on its way, as ``Allowances``
    reads it, and on every retry after a conflict). The pause ends at ``resume``."""

    def __init__(self) -> None:
        super().__init__()
        self.pause_next: Literal["", "read", "write"] = ""
        self.paused, self.resume = asyncio.Event(), asyncio.Event()

    async def update(self, key: str, change: Any, *, ttl_s: float) -> Any:
        pause, self.pause_next = self.pause_next, ""
        if pause == "read":
            await self._pause()
        pool = await super().update(key, change, ttl_s=ttl_s)
        if pause == "write":
            await self._pause()
        return pool

    async def _pause(self) -> None:
        self.paused.set()
        await self.resume.wait()


class LosingBoard(MemoryAllowances):
    """The memory twin whose next change applies and then raises (``lose_next``), as a write
    whose answer timed out, and whose retries failed too, leaves it in ``Allowances``."""

    def __init__(self) -> None:
        super().__init__()
        self.lose_next = False

    async def update(self, key: str, change: Any, *, ttl_s: float) -> Any:
        pool = await super().update(key, change, ttl_s=ttl_s)
        if self.lose_next:
            self.lose_next = False
            raise RequestFailed(f"allowance {key}", "TimeoutError (memory twin)")
        return pool


async def holding_600_of_1000(board: MemoryAllowances) -> tuple[list[LeaseContext], list[Held]]:
    """Two gateways on one budget of 1,000; the first took 300 twice: near the limit, it
    holds exactly the 600 in use."""
    ctxs = contexts(board, 2, [10**18])
    leases = [Held("usd.key.a.2026-12-07", 1000, charge_expired=True) for _ in ctxs]
    assert await leases[0].take(ctxs[0], 300)
    assert await leases[0].take(ctxs[0], 300)
    assert leases[0].hold == 600
    return ctxs, leases


async def test_a_take_while_a_write_is_on_its_way_never_passes_the_budget() -> None:
    board = PausingBoard()
    ctxs, leases = await holding_600_of_1000(board)
    leases[0].give_back(300)  # a call that failed before any chunk: its 300 go back
    board.pause_next = "write"
    flush = asyncio.create_task(leases[0].flush(ctxs[0]))  # the hold becomes 300
    await board.paused.wait()
    late = asyncio.create_task(leases[0].take(ctxs[0], 300))  # a call admitted meanwhile
    board.resume.set()
    await flush
    taken = [await late, await leases[1].take(ctxs[1], 700)]
    in_use = leases[0].in_use + leases[1].in_use
    pool = board.pools_by_key["usd.key.a.2026-12-07"]
    assert in_use <= 1000, f"{in_use} reserved of a 1,000 budget"
    assert taken.count(True) == 1
    assert sum(hold.amount for hold in pool.holds.values()) == in_use


async def test_spend_given_back_while_a_write_reads_the_pool_stays_inside_the_hold() -> None:
    """The real board computes a change after its read (a round trip, and again after each
    conflict): a call settled meanwhile is neither in the ``used`` that write adds nor in the
    hold it leaves, and another gateway could take that budget."""
    board = PausingBoard()
    ctxs, leases = await holding_600_of_1000(board)
    leases[0].give_back(300)  # a call that failed before any chunk: its 300 go back
    board.pause_next = "read"
    flush = asyncio.create_task(leases[0].flush(ctxs[0]))  # its read on its way
    await board.paused.wait()
    leases[0].give_back(300, spent=300)  # the other call streamed with no usage: all spent
    board.resume.set()
    await flush
    spent = 300
    assert not await leases[1].take(ctxs[1], 1000), "1,000 reserved with 300 spent"
    assert await leases[1].take(ctxs[1], 700)
    await leases[0].flush(ctxs[0])
    pool = board.pools_by_key["usd.key.a.2026-12-07"]
    assert (pool.used, pool.held(now_ns=10**18)) == (spent, 700)


async def test_a_write_that_applied_but_failed_leaves_no_take_outside_the_hold() -> None:
    """A write whose answer was lost (timed out, and its retries failed) may have applied:
    the hold the others see may be the smaller one it wrote, so no take may count on more."""
    board = LosingBoard()
    ctxs, leases = await holding_600_of_1000(board)
    leases[0].give_back(300)  # a call that failed before any chunk: its 300 go back
    board.lose_next = True
    with pytest.raises(RequestFailed):
        await leases[0].flush(ctxs[0])  # the board now holds 300 for it
    taken = [await leases[0].take(ctxs[0], 300), await leases[1].take(ctxs[1], 700)]
    in_use = leases[0].in_use + leases[1].in_use
    pool = board.pools_by_key["usd.key.a.2026-12-07"]
    assert in_use <= 1000, f"{in_use} reserved of a 1,000 budget"
    assert taken.count(True) == 1
    assert pool.held(now_ns=10**18) >= in_use


async def test_tokens_that_end_while_the_minute_is_written_are_written_next() -> None:
    board = PausingBoard()
    [ctx] = contexts(board, 1, [10**18])
    tokens = WindowTokens("tpm.key.a", 30)
    assert tokens.admits(7)
    tokens.add(7, 22)  # a call ended
    board.pause_next = "write"
    flush = asyncio.create_task(tokens.flush(ctx, 7))
    await board.paused.wait()
    tokens.add(7, 22)  # another call ended while the first one's tokens were written
    board.resume.set()
    await flush
    assert not tokens.admits(7), "44 tokens of a 30-token minute, and another call admitted"
    await tokens.flush(ctx, 7)
    assert board.pools_by_key["tpm.key.a.7"].used == 44


async def test_tokens_of_a_call_that_ends_as_a_minute_begins_count_in_that_minute() -> None:
    """A call admitted in one minute ends in the next before that minute's first admission:
    its tokens are written to the new minute, and the new minute's first admission sees them."""
    board = MemoryAllowances()
    [ctx] = contexts(board, 1, [10**18])
    tokens = WindowTokens("tpm.key.a", 30)
    assert tokens.admits(7)
    tokens.add(8, 40)  # it ended in minute 8: past the limit of minute 8 alone
    assert tokens.due(8, 10**18)
    await tokens.flush(ctx, 8)
    assert board.pools_by_key["tpm.key.a.8"].used == 40
    assert not tokens.admits(8), "40 tokens of a 30-token minute, and another call admitted"


async def test_a_key_first_seen_while_the_tokens_are_written_stops_no_flush() -> None:
    """The background flush writes each scope's tokens in turn; a key first called while one
    is on its way adds a scope, and the flush must go on (it died, and with it every later
    write of tokens, spend, give back and renewal of this gateway)."""
    board = PausingBoard()
    now = 1_700_000_050 * 10**9
    limiter = Limiter(board, clock_ns=lambda: now, hold_ttl_s=15.0)
    text = "".join(
        f'[[keys]]\nname = "{name}"\nsha256 = "{digit * 64}"\nlimits = {{ tpm = 100 }}\n'
        for name, digit in (("a", "0"), ("b", "1"))
    )
    first, second = (named.caller for named in parse_keys(text.encode()))
    (await limiter.admit(first, None)).end(tokens=22, cost_pusd=None)
    board.pause_next = "write"
    flush = asyncio.create_task(limiter.flush())
    await board.paused.wait()
    await limiter.admit(second, None)  # its scope is new to this gateway
    board.resume.set()
    await flush
    await limiter.flush()
    minute = now // 10**9 // 60
    assert board.pools_by_key[f"tpm.key.a.{minute}"].used == 22


class FailingOnce(MemoryAllowances):
    """The memory twin whose first change raises an error no flush expects (a bug's)."""

    def __init__(self) -> None:
        super().__init__()
        self.failed, self.written = asyncio.Event(), asyncio.Event()

    async def update(self, key: str, change: Any, *, ttl_s: float) -> Any:
        if not self.failed.is_set():
            self.failed.set()
            raise RuntimeError("a bug in a flush")
        pool = await super().update(key, change, ttl_s=ttl_s)
        self.written.set()
        return pool


async def test_the_background_flush_outlives_an_error_it_did_not_expect() -> None:
    board = FailingOnce()
    now = [1_700_000_050 * 10**9]
    limiter = Limiter(board, clock_ns=lambda: now[0], hold_ttl_s=15.0)
    text = f'[[keys]]\nname = "a"\nsha256 = "{"0" * 64}"\nlimits = {{ tpm = 100 }}\n'
    [caller] = (named.caller for named in parse_keys(text.encode()))
    async with limiter.running():
        (await limiter.admit(caller, None)).end(tokens=22, cost_pusd=None)
        limiter.kick()
        await asyncio.wait_for(board.failed.wait(), 10)
        (await limiter.admit(caller, None)).end(tokens=5, cost_pusd=None)
        now[0] += 2 * 10**9  # the tokens are due again a second after the last try
        limiter.kick()
        await asyncio.wait_for(board.written.wait(), 10)  # the loop went on
    minute = now[0] // 10**9 // 60
    assert board.pools_by_key[f"tpm.key.a.{minute}"].used == 27


def test_periods_and_durations() -> None:
    assert budget_period("day", 1_700_000_050)[0] == "2023-11-14"
    key, resets = budget_period("month", 1_700_000_050)
    assert (key, resets.isoformat()) == ("2023-11", "2023-12-01T00:00:00+00:00")
    assert [openai_duration(s) for s in (0.2, 10, 360, 3723)] == ["1s", "10s", "6m0s", "1h2m3s"]


def test_tokenwire_limits_rows_show_this_minute_and_charge_a_dead_gateways_hold() -> None:
    from tokenwire.broker import Hold, Pool
    from tokenwire.cli._limits import usage_rows
    from tokenwire.schemas import Budget, Limits

    now = 1_796_000_000 * 10**9
    minute = now // 10**9 // 60
    pools = {
        f"rpm.key.team.a.{minute}": Pool(42),
        f"rpm.key.team.a.{minute - 1}": Pool(60),  # a past minute: not shown
        "conc.tenant.acme": Pool(0, {"g1": Hold(2, now + 10**9)}),
        "usd.key.team.a.2026-12-07": Pool(
            10**9, {"dead": Hold(5 * 10**8, now - 1), "live": Hold(10**8, now + 10**9)}
        ),
    }
    limits = Limits(rpm=60, concurrent=3, budget=Budget(usd="0.01"))
    rows = usage_rows(pools, {("key", "team.a"): limits, ("tenant", "acme"): limits}, now_ns=now)
    got = [(r["scope"], r["name"], r["counter"], r["used"], r["held"], r["limit"]) for r in rows]
    assert got == [
        ("tenant", "acme", "streams", 0, 2, 3),
        ("key", "team.a", "requests/min", 42, 0, 60),
        ("key", "team.a", "usd", "0.001500000000", "0.000100000000", "0.01 per day"),
    ]


async def test_a_calls_reservation_is_priced_at_the_dearest_deployment_it_may_reach() -> None:
    """A routed call that may fall back reserves at its dearest target, so a fallback never
    settles above what the budget held for it (the prices: genai-prices, independently)."""

    class Stub:
        def limits(self, caller: object) -> bool:
            return True

        async def admit(self, caller: object, reservation: Any) -> int:
            return int(reservation())

    targets = [("openai", "gpt-4o-mini", None), ("anthropic", "claude-sonnet-4-5", None)]
    usage = TokenUsage(input_tokens=100, output_tokens=50)
    costs = [price_step(p, m, usage, 0).pusd for p, m, _ in targets]
    assert None not in costs
    admitted = await admit_call(
        Stub(),  # type: ignore[arg-type]  # the limiter's two calls admit_call makes
        parse_keys(f'[[keys]]\nname = "a"\nsha256 = "{"0" * 64}"\n'.encode())[0].caller,
        body={"max_tokens": 50},
        body_bytes=100,
        targets=targets,
        default_cap=4096,
        at_ns=0,
    )
    assert admitted == max(c for c in costs if c is not None)  # type: ignore[comparison-overlap]  # the stub admits with the reservation
    assert costs[0] != costs[1]
