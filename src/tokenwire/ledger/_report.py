"""The ledger as JSON documents: what ``tokenwire usage --json`` prints and ``GET /v1/usage``
and ``GET /v1/sessions/{session}/usage`` answer (one shape for all of them).

Costs appear as ``cost_usd`` numbers (the exact stored pico-USD divided by 10^12) and
``cost_pusd`` integers (exact); a group none of whose steps was priced has ``cost_usd: null``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenwire.ledger._lines import TOKEN_FIELDS, StepUsage, UsageGroup, UsageTotals, line_totals
from tokenwire.ledger._query import UsageBy


def totals_json(totals: UsageTotals) -> dict[str, Any]:
    """One group's sums: steps (reported, priced, unpriced), tokens by kind, cost."""
    cost = totals.cost_usd
    return {
        "steps": totals.steps,
        "reported": totals.reported,
        "priced": totals.priced,
        "unpriced": totals.unpriced,
        **{name: getattr(totals, name) for name in TOKEN_FIELDS},
        "cost_usd": float(cost) if cost is not None else None,
        "cost_pusd": totals.cost_pusd if totals.priced else None,
    }


def usage_report(
    by: UsageBy, groups: Sequence[UsageGroup], since: str | None, tenant: str | None
) -> dict[str, Any]:
    """``{"by", "since", "tenant", "rows": [{by: key, ...sums}], "total": {...sums}}``."""
    total = sum((g.totals for g in groups), UsageTotals())
    return {
        "by": by,
        "since": since,
        "tenant": tenant,
        "rows": [{by: g.key, **totals_json(g.totals)} for g in groups],
        "total": totals_json(total),
    }


def line_json(line: StepUsage) -> dict[str, Any]:
    """One step's line: identity, owner, day, usage as reported (absent counts null), cost."""
    usage = line.usage
    cost = line.cost_usd
    return {
        "turn": line.turn,
        "step": line.step,
        "provider": line.provider,
        "model": line.model,
        "key_name": line.key_name,
        "tenant": line.tenant,
        "day": line.day,
        "time_ns": line.time_ns,
        "outcome": line.outcome_kind,
        "reported": usage is not None,
        **{name: getattr(usage, name) if usage is not None else None for name in TOKEN_FIELDS},
        "cost_usd": float(cost) if cost is not None else None,
        "cost_pusd": line.cost_pusd,
        "cost_reason": line.cost_reason,
        "price_version": line.price_version,
        "price_source": line.price_source,
    }


def session_report(session: str, lines: Sequence[StepUsage]) -> dict[str, Any]:
    """``{"session", "steps": [line...], "total": {...sums}}``."""
    total = sum((line_totals(line) for line in lines), UsageTotals())
    return {
        "session": session,
        "steps": [line_json(line) for line in lines],
        "total": totals_json(total),
    }
