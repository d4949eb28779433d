"""Routed steps in every backend: the step's record names the deployment that served it and the
attempts that failed before it (from its first chunk), and a deployment's own price decides
its ledger line (``price_source: deployment``). Expected costs are computed here from the
price and the counts (pico-USD per token times tokens), never read back first."""

from __future__ import annotations

import msgspec

from tokenwire.schemas import (
    DeploymentPrice,
    ErrorEvent,
    FailedAttempt,
    MessageEvent,
    Routed,
    TokenUsage,
)
from tokenwire.store import StepRecord, Store

from .builders import message_record
from .ledger_fleet import PRICE_VERSION, step

PRICE = DeploymentPrice(input_pusd=2_500_000, output_pusd=10_000_000, cache_read_pusd=1_250_000)
ROUTED = Routed(
    route="gpt-4o",
    deployment="azure-east",
    attempts=[
        FailedAttempt(
            "openai-main",
            "openai",
            "gpt-4o",
            "rate-limited",
            "slow down",
            status=429,
            retry_after_s=30.0,
        )
    ],
    price=PRICE,
)


def _routed(record: StepRecord, routed: Routed = ROUTED) -> StepRecord:
    first = msgspec.structs.replace(record.chunks[0], routed=routed)
    return msgspec.structs.replace(record, chunks=[first, *record.chunks[1:]])


async def test_the_record_names_the_deployment_and_the_failed_attempts(store: Store) -> None:
    plain = message_record("s", 0, 0, 3)
    routed = _routed(message_record("s", 0, 1, 3))
    await store.commit([plain, routed])
    [first, second] = await store.messages("s")
    assert isinstance(first, MessageEvent)
    assert isinstance(second, MessageEvent)
    assert first.routed is msgspec.UNSET
    assert second.routed == ROUTED
    assert await store.step_outcome("s", 0, 1) == second
    events = await store.session_events("s")
    assert [e for e in events if isinstance(e, MessageEvent)] == [first, second]


async def test_a_deployment_price_decides_the_line(store: Store) -> None:
    usage = TokenUsage(
        input_tokens=900, output_tokens=40, cache_read_tokens=300, reasoning_tokens=5
    )
    priced = _routed(step("d", 0, 0, usage))
    unpriced_cache = _routed(
        step("d", 0, 1, TokenUsage(input_tokens=1, output_tokens=1, cache_write_tokens=9))
    )
    genai = step("d", 0, 2, usage)  # provider/model: genai-prices as before
    [a, b, c] = await store.commit([priced, unpriced_cache, genai])
    assert a.usage is not None
    assert b.usage is not None
    assert c.usage is not None
    expected = 900 * 2_500_000 + (40 + 5) * 10_000_000 + 300 * 1_250_000
    assert (a.usage.cost_pusd, a.usage.price_source) == (expected, "deployment")
    assert a.usage.price_version == "deployment azure-east"
    assert b.usage.cost_pusd is None
    assert b.usage.cost_reason is not None
    assert "cache_write" in b.usage.cost_reason
    assert (c.usage.price_source, c.usage.price_version) == ("genai-prices", PRICE_VERSION)
    assert await store.session_usage("d") == [a.usage, b.usage, c.usage]


async def test_a_failed_routed_step_names_the_last_deployment_tried(store: Store) -> None:
    failed = step("f", 0, 0, None, failed=True)
    last = Routed(route="gpt-4o", deployment="azure-west", attempts=ROUTED.attempts)
    await store.commit([_routed(failed, last)])
    [event] = await store.messages("f")
    assert isinstance(event, ErrorEvent)
    assert event.routed == last


async def test_a_repair_writes_the_route_the_retained_step_carries(store: Store) -> None:
    """``rebuild --repair`` rewrites a step from the broker's record: its route comes with it
    (the deployment column and the events), and its line is priced at the deployment's price."""
    stored = step("r", 0, 0, TokenUsage(input_tokens=100, output_tokens=10))
    await store.commit([stored])
    retained = _routed(stored)
    repaired = await store.replace_step(retained)
    assert repaired is not None
    assert repaired.replaced
    [event] = await store.messages("r")
    assert isinstance(event, MessageEvent)
    assert event.routed == ROUTED
    [line] = await store.session_usage("r")
    assert (line.price_source, line.cost_pusd) == ("deployment", 100 * 2_500_000 + 10 * 10_000_000)
