"""The gateway's limits and budgets rows (docs/gateway.md, "Limits and budgets"; ADR 0042),
re-exported by the catalogue, which lists them in ``VARIABLES`` with the gateway's own."""

from __future__ import annotations

from tokenwire.variables._parse import integer, seconds_at_least
from tokenwire.variables._variable import Variable

BUDGET_DEFAULT_MAX_TOKENS: Variable[int] = Variable(
    env="TOKENWIRE_BUDGET_DEFAULT_MAX_TOKENS",
    flag="budget-default-max-tokens",
    parse=integer(1, 10_000_000),
    default="4096",
    meaning=(
        "Output tokens a call reserves under a budget when the caller set no max_tokens (its "
        "worst-case cost is its input plus this many output tokens at the model's price; the "
        "call is not changed, and settles to its exact cost when it ends)."
    ),
    commands=("gateway", "up"),
)
LIMITS_HOLD_TTL_S: Variable[float] = Variable(
    env="TOKENWIRE_LIMITS_HOLD_TTL_S",
    flag="limits-hold-ttl-s",
    parse=seconds_at_least(3.0),
    default="15",
    meaning=(
        "How long a gateway's share of a key's streams or budget lasts unless renewed (every "
        "third of it): a dead gateway's streams are freed, and its budget share charged in "
        "full, this long after its last renewal."
    ),
    commands=("gateway", "up"),
)
