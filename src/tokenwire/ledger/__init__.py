"""The usage and cost ledger: what each step used and cost, and how it adds up.

Every stored step gets one :class:`StepUsage` line, written in the store's commit with the
step (docs/ledger.md): its provider, model, owner (key name, tenant), UTC day, the token usage
the provider reported and its cost from genai-prices (:func:`price_step`), or a null cost and
the reason. :class:`UsageTotals` add lines up; a usage query groups them :data:`UsageBy` one
dimension from a first day on (:func:`parse_since`).

Example::

    cost = price_step("openai", "gpt-4o", TokenUsage(input_tokens=900, output_tokens=40), t_ns)
    cost.pusd, cost.reason, cost.price_version   # 2650000000, None, 'genai-prices 0.2.3'

Errors::

    LedgerError
    └── InvalidUsageQuery
"""

from tokenwire.ledger._cost import (
    PICO_PER_USD,
    PRICE_PROVIDERS,
    Cost,
    PriceSource,
    deployment_cost,
    preload,
    price_step,
    price_version,
    to_pusd,
    to_usd,
)
from tokenwire.ledger._errors import InvalidUsageQuery, LedgerError
from tokenwire.ledger._lines import (
    TOKEN_FIELDS,
    StepUsage,
    UsageGroup,
    UsageTotals,
    line_totals,
)
from tokenwire.ledger._query import USAGE_BY, UsageBy, day_of, parse_since, usage_by
from tokenwire.ledger._report import line_json, session_report, totals_json, usage_report

__all__ = [
    "PICO_PER_USD",
    "PRICE_PROVIDERS",
    "TOKEN_FIELDS",
    "USAGE_BY",
    "Cost",
    "InvalidUsageQuery",
    "LedgerError",
    "PriceSource",
    "StepUsage",
    "UsageBy",
    "UsageGroup",
    "UsageTotals",
    "day_of",
    "deployment_cost",
    "line_json",
    "line_totals",
    "parse_since",
    "preload",
    "price_step",
    "price_version",
    "session_report",
    "to_pusd",
    "to_usd",
    "totals_json",
    "usage_by",
    "usage_report",
]
