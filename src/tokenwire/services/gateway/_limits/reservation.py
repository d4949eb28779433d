"""What a call may cost at most, and what it cost: the ledger's prices (ADR 0028, 0040).

A call's reservation is its input bound plus its output cap at the model's price: the input
bound is the request body's length in bytes (no tokenizer counts a byte of text as more than
one token), the output cap its ``max_tokens`` (``max_completion_tokens``,
``max_output_tokens``) or, when it set none, ``TOKENWIRE_BUDGET_DEFAULT_MAX_TOKENS``. A routed
deployment with its own price is priced with it. Its cost when it ends is the ledger's:
:func:`tokenwire.ledger.price_step` of the usage the provider reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tokenwire.ledger import Cost, deployment_cost, price_step
from tokenwire.schemas import DeploymentPrice, Routed, TokenUsage
from tokenwire.services.gateway._errors import UnpricedModelError

_CAPS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def output_cap(body: Mapping[str, Any], default: int) -> int:
    """The most output tokens the call asked for (checked by its dialect), else ``default``."""
    for name in _CAPS:
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default


def reservation_pusd(
    provider: str,
    model: str,
    *,
    price: DeploymentPrice | None,
    input_bound: int,
    output_cap: int,
    at_ns: int,
) -> int:
    """The call's worst-case cost in pico-USD; :class:`UnpricedModelError` without a price."""
    usage = TokenUsage(input_tokens=input_bound, output_tokens=output_cap)
    cost = (
        deployment_cost("reservation", price, usage)
        if price is not None
        else price_step(provider, model, usage, at_ns)
    )
    if cost.pusd is None:
        raise UnpricedModelError(f"{provider}/{model}", why=cost.reason or "no price")
    return cost.pusd


def settled_cost(
    provider: str, model: str, usage: TokenUsage | None, at_ns: int, routed: Routed | None
) -> Cost:
    """What the ledger will record for the step (the same function, the same inputs)."""
    return price_step(provider, model, usage, at_ns, routed)
