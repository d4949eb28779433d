"""A small fleet of steps for the ledger tests, and the oracle of their lines and totals.

Expected lines and totals are computed here from the records (and costs by calling
genai-prices directly with the counts in its own terms), never read back from the store.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN

import msgspec
from genai_prices import Usage, calc_price

from tokenwire.ledger import StepUsage, UsageTotals
from tokenwire.schemas import (
    ChunkEnvelope,
    Finish,
    Message,
    RecordedError,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
)
from tokenwire.schemas import Usage as UsageChunk
from tokenwire.store import StepRecord

DAY_1 = 1_767_571_200 * 10**9  # 2026-01-05T00:00:00Z
DAY_2 = DAY_1 + 86_400 * 10**9  # 2026-01-06
PRICE_VERSION = f"genai-prices {importlib.metadata.version('genai-prices')}"


def step(
    session: str,
    turn: int,
    step_: int,
    usage: TokenUsage | None,
    *,
    provider: str = "openai",
    model: str = "gpt-4o-mini",
    at_ns: int = DAY_1,
    key: str | None = None,
    tenant: str | None = None,
    failed: bool = False,
) -> StepRecord:
    """A step of three chunks (ordinal 0 carries the owner when given)."""
    chunks: list[StreamChunk] = [
        TextDelta(index=0, text="hi"),
        *([UsageChunk(usage=usage)] if usage is not None else []),
        Finish(reason="stop"),
    ]
    envelopes = [
        ChunkEnvelope(session, turn, step_, i, at_ns + i, provider, model, c)
        for i, c in enumerate(chunks)
    ]
    owner = {k: v for k, v in (("key_name", key), ("tenant", tenant)) if v is not None}
    envelopes[0] = msgspec.structs.replace(envelopes[0], **owner)
    outcome: Message | RecordedError = (
        RecordedError(kind="provider", message="overloaded", usage=usage)
        if failed
        else Message(content=[TextBlock(text="hi")], finish_reason="stop", usage=usage)
    )
    return StepRecord(session, turn, step_, provider, model, envelopes, outcome, at_ns + 10)


def independent_cost(provider: str, model: str, u: TokenUsage, at_ns: int) -> int:
    """genai-prices called directly: input includes cache, output includes reasoning."""
    cr, cw, rs = u.cache_read_tokens or 0, u.cache_write_tokens or 0, u.reasoning_tokens or 0
    price = calc_price(
        Usage(
            input_tokens=(u.input_tokens or 0) + cr + cw,
            cache_read_tokens=cr,
            cache_write_tokens=cw,
            output_tokens=(u.output_tokens or 0) + rs,
        ),
        model,
        provider_id=provider,
        genai_request_timestamp=datetime.fromtimestamp(at_ns / 1e9, UTC),
    )
    return int((price.total_price * 10**12).to_integral_value(ROUND_HALF_EVEN))


PRICED = TokenUsage(input_tokens=900, output_tokens=40, cache_read_tokens=300)
CLAUDE = TokenUsage(
    input_tokens=12, output_tokens=200, cache_write_tokens=1165, reasoning_tokens=30
)
SCRIPTED = TokenUsage(input_tokens=10, output_tokens=8)


def fleet() -> list[StepRecord]:
    return [
        step("a", 0, 0, PRICED, key="ci", tenant="acme"),
        step(
            "a",
            0,
            1,
            CLAUDE,
            provider="anthropic",
            model="claude-sonnet-4-5",
            key="ci",
            tenant="acme",
            at_ns=DAY_2,
        ),
        step("a", 1, 0, None, key="ci", tenant="acme"),  # the provider sent no usage
        step("b", 0, 0, SCRIPTED, provider="scripted", model="tools", key="dev", tenant="beta"),
        step("b", 0, 1, PRICED, failed=True, key="dev", tenant="beta", at_ns=DAY_2),
        step("c", 0, 0, TokenUsage(output_tokens=5)),  # no named keys; input not reported
    ]


def expected_line(r: StepRecord) -> StepUsage:
    usage = r.outcome.usage
    first = r.chunks[0]
    cost, reason = None, None
    if usage is None:
        reason = "no usage reported"
    elif usage.input_tokens is None:
        reason = "incomplete usage: input_tokens not reported"
    elif r.provider == "scripted":
        reason = "no price for scripted/tools: 'scripted' has no list price"
    else:
        cost = independent_cost(r.provider, r.model, usage, first.time_ns)
    return StepUsage(
        r.session,
        r.turn,
        r.step,
        r.provider,
        r.model,
        first.key_name or None,
        first.tenant or None,
        datetime.fromtimestamp(first.time_ns / 1e9, UTC).date().isoformat(),
        first.time_ns,
        r.outcome_kind,
        usage,
        cost,
        reason,
        PRICE_VERSION,
    )


def totals(lines: list[StepUsage]) -> UsageTotals:
    """The oracle's sums, field by field."""

    def count(name: str) -> int:
        return sum(getattr(li.usage, name) or 0 for li in lines if li.usage is not None)

    return UsageTotals(
        steps=len(lines),
        reported=sum(li.usage is not None for li in lines),
        priced=sum(li.cost_pusd is not None for li in lines),
        input_tokens=count("input_tokens"),
        output_tokens=count("output_tokens"),
        cache_read_tokens=count("cache_read_tokens"),
        cache_write_tokens=count("cache_write_tokens"),
        reasoning_tokens=count("reasoning_tokens"),
        cost_pusd=sum(li.cost_pusd or 0 for li in lines),
    )


def grouped(
    lines: list[StepUsage], key: Callable[[StepUsage], str | None]
) -> dict[str | None, UsageTotals]:
    keys = sorted({key(li) for li in lines}, key=lambda k: k or "")
    return {k: totals([li for li in lines if key(li) == k]) for k in keys}
