"""The usage ledger, run against every backend: one line per stored step, written with it.

Expected lines and totals are computed here from the records (and costs by calling
genai-prices directly with the counts in its own terms), never read back from the store first.
"""

from __future__ import annotations

from decimal import Decimal

import msgspec
import pytest

from tokenwire.ledger import UsageTotals
from tokenwire.store import Store

from .ledger_fleet import PRICED, expected_line, fleet, grouped, step, totals


async def by(store: Store, dimension, **kw) -> dict[str | None, UsageTotals]:
    return {g.key: g.totals for g in await store.usage(dimension, **kw)}


async def test_every_step_gets_one_line_priced_by_genai_prices(store: Store) -> None:
    records = fleet()
    results = await store.commit(records)
    lines = [expected_line(r) for r in records]

    assert [r.usage for r in results] == lines
    assert await store.session_usage("a") == lines[:3]
    assert await store.session_usage("b") == lines[3:5]
    assert await store.session_usage("nobody") == []
    priced = [li for li in lines if li.cost_pusd is not None]
    assert [li.session for li in priced] == ["a", "a", "b"]  # the failed step cost money too
    assert lines[0].cost_usd == Decimal(lines[0].cost_pusd or 0) / 10**12 > 0


async def test_rollups_by_every_dimension_equal_the_sums_of_the_lines(store: Store) -> None:
    records = fleet()
    await store.commit(records)
    lines = [expected_line(r) for r in records]

    assert await by(store, "model") == grouped(lines, lambda li: f"{li.provider}/{li.model}")
    assert await by(store, "provider") == grouped(lines, lambda li: li.provider)
    assert await by(store, "key") == grouped(lines, lambda li: li.key_name)
    assert await by(store, "tenant") == grouped(lines, lambda li: li.tenant)
    assert await by(store, "day") == grouped(lines, lambda li: li.day)
    assert await by(store, "session") == grouped(lines, lambda li: li.session)
    assert list(await by(store, "day")) == ["2026-01-05", "2026-01-06"]
    assert (await by(store, "model"))["openai/gpt-4o-mini"].unpriced == 2


async def test_since_and_tenant_restrict_every_grouping(store: Store) -> None:
    records = fleet()
    await store.commit(records)
    lines = [expected_line(r) for r in records]
    late = [li for li in lines if li.day >= "2026-01-06"]
    acme = [li for li in lines if li.tenant == "acme"]
    untenanted = [li for li in lines if li.tenant is None]

    for dimension in ("model", "session"):
        got = await by(store, dimension, since="2026-01-06")
        assert sum(got.values(), UsageTotals()) == totals(late)
        assert sum((await by(store, dimension, tenant="acme")).values(), UsageTotals()) == totals(
            acme
        )
        assert sum((await by(store, dimension, tenant="")).values(), UsageTotals()) == totals(
            untenanted
        )
    assert await by(store, "tenant", tenant="nobody") == {}


async def test_redelivered_and_duplicate_steps_are_counted_once(store: Store) -> None:
    records = fleet()
    lines = [expected_line(r) for r in records]
    await store.commit(records[:4])
    again = await store.commit([records[3], records[3], *records])  # overlaps and duplicates
    assert [r.usage for r in again] == [None, None, None, None, None, None, lines[4], lines[5]]
    assert await by(store, "model") == grouped(lines, lambda li: f"{li.provider}/{li.model}")


async def test_delete_session_takes_its_lines_out_and_truncate_empties(store: Store) -> None:
    records = fleet()
    await store.commit(records)
    lines = [expected_line(r) for r in records]
    await store.delete_session("a")
    rest = [li for li in lines if li.session != "a"]
    assert await by(store, "day") == grouped(rest, lambda li: li.day)
    assert await by(store, "key") == grouped(rest, lambda li: li.key_name)
    assert await store.session_usage("a") == []
    await store.commit(records[:3])  # a rebuilt session is counted once more, not twice
    assert await by(store, "model") == grouped(lines, lambda li: f"{li.provider}/{li.model}")
    await store.truncate()
    assert await store.usage("model") == []
    assert await store.session_usage("b") == []


@pytest.mark.parametrize("missing", ["input_tokens", "output_tokens"])
async def test_a_step_without_input_or_output_counts_is_never_priced(
    store: Store, missing: str
) -> None:
    usage = msgspec.structs.replace(PRICED, **{missing: None})
    [done] = await store.commit([step("p", 0, 0, usage)])
    assert done.usage is not None
    assert done.usage.cost_pusd is None
    assert done.usage.cost_reason == f"incomplete usage: {missing} not reported"
    assert done.usage.usage == usage  # the reported counts stay as reported, none invented
