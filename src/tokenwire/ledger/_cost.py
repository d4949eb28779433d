"""What a step cost: its reported usage priced by genai-prices (pydantic's price data).

The price library is imported on first use (:func:`preload` does it ahead, off the commit
path; docs/ledger.md says what loading costs). A step is priced only when the provider
reported both its input and its output tokens and its model is found in the price data;
otherwise its cost is ``None`` with the reason, never an estimate. Costs are integers of
pico-USD (10^-12 USD), rounded half-even: exact for every per-token price with at most six
decimals per million tokens, and summable in SQL without floating point. ADR 0028.
"""

from __future__ import annotations

import importlib.metadata
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN, Decimal
from functools import cache
from typing import TYPE_CHECKING, Literal

import msgspec

from tokenwire.schemas import DeploymentPrice, Routed, TokenUsage

if TYPE_CHECKING:
    from genai_prices.types import Usage as PricedUsage

PICO_PER_USD = 10**12
"""Costs are stored as integers of this many parts of a US dollar."""

PRICE_PROVIDERS: dict[str, str] = {
    "openai": "openai",
    "openai-responses": "openai",
    "anthropic": "anthropic",
    "deepseek": "deepseek",
    "gemini": "google",
    "groq": "groq",
    "azure": "azure",
    "openrouter": "openrouter",
}
"""tokenwire provider name -> genai-prices provider id. Absent on purpose: ``vllm``
(self-hosted, no list price) and ``scripted`` (the offline test provider): their steps are
recorded with a null cost and the reason."""


PriceSource = Literal["genai-prices", "deployment"]
"""What decided a step's cost: genai-prices' data, or the routes file's price of the deployment
that served it (docs/ledger.md)."""


class Cost(msgspec.Struct, frozen=True):
    """The cost of one step: ``pusd`` pico-USD, or ``None`` with ``reason``.

    ``price_version`` names the price data that decided it (``"genai-prices 0.2.3"``, or
    ``"deployment azure-east"`` for a routes file's price), also when it found no price: a
    later version may know the model. ``source`` says which of the two it was.
    """

    pusd: int | None
    reason: str | None
    price_version: str
    source: PriceSource = "genai-prices"


@cache
def price_version() -> str:
    """The price data in use: the installed genai-prices (its bundled snapshot)."""
    return f"genai-prices {importlib.metadata.version('genai-prices')}"


def preload() -> None:
    """Import the price library and build its data now (about 0.7 s, once per process), so
    that the first priced commit does not pay for it."""
    price_step("openai", "gpt-4o", TokenUsage(input_tokens=1, output_tokens=1), 0)


def price_step(
    provider: str, model: str, usage: TokenUsage | None, at_ns: int, routed: Routed | None = None
) -> Cost:
    """Price one step's ``usage`` for ``provider``/``model`` at ``at_ns`` (Unix ns: the price
    in force when the step streamed, so a rebuild prices it the same way). A routed step whose
    deployment carries its own price (``routed.price``, from its first chunk) is priced with
    it instead (:func:`deployment_cost`).

    >>> price_step("scripted", "tools", TokenUsage(input_tokens=10, output_tokens=8), 0).reason
    "no price for scripted/tools: 'scripted' has no list price"
    """
    if routed is not None and routed.price is not None:
        return deployment_cost(routed.deployment, routed.price, usage)
    version = price_version()
    if usage is None:
        return Cost(None, "no usage reported", version)
    missing = [n for n in ("input_tokens", "output_tokens") if getattr(usage, n) is None]
    if missing:
        return Cost(None, f"incomplete usage: {' and '.join(missing)} not reported", version)
    provider_id = PRICE_PROVIDERS.get(provider)
    if provider_id is None:
        reason = f"no price for {provider}/{model}: {provider!r} has no list price"
        return Cost(None, reason, version)
    return _priced(provider_id, provider, model, usage, at_ns, version)


def deployment_cost(deployment: str, price: DeploymentPrice, usage: TokenUsage | None) -> Cost:
    """``usage`` at a deployment's own price (pico-USD per token, exact): input, output and
    reasoning tokens (at the output rate), cache reads and writes at their rates. A count of
    a kind the price has no rate for is not guessed: the step is not priced, with the reason.

    >>> p = DeploymentPrice(input_pusd=2_500_000, output_pusd=10_000_000)
    >>> deployment_cost("east", p, TokenUsage(input_tokens=1000, output_tokens=100)).pusd
    3500000000
    """
    version = f"deployment {deployment}"
    if usage is None:
        return Cost(None, "no usage reported", version, "deployment")
    missing = [n for n in ("input_tokens", "output_tokens") if getattr(usage, n) is None]
    if missing:
        why = f"incomplete usage: {' and '.join(missing)} not reported"
        return Cost(None, why, version, "deployment")
    total = (usage.input_tokens or 0) * price.input_pusd
    total += ((usage.output_tokens or 0) + (usage.reasoning_tokens or 0)) * price.output_pusd
    for count, rate, kind in (
        (usage.cache_read_tokens, price.cache_read_pusd, "cache_read"),
        (usage.cache_write_tokens, price.cache_write_pusd, "cache_write"),
    ):
        if count:
            if rate is None:
                why = f"no {kind} price for deployment {deployment} ({count} tokens reported)"
                return Cost(None, why, version, "deployment")
            total += count * rate
    return Cost(total, None, version, "deployment")


def _priced(
    provider_id: str, provider: str, model: str, usage: TokenUsage, at_ns: int, version: str
) -> Cost:
    from genai_prices import calc_price

    try:
        price = calc_price(
            _priced_usage(usage),
            model,
            provider_id=provider_id,
            genai_request_timestamp=_timestamp(at_ns),
        )
    except LookupError:
        return Cost(None, f"no price for {provider}/{model} in {version}", version)
    except ValueError as exc:  # usage the price data cannot split (it names what)
        return Cost(None, f"no price for {provider}/{model}: {exc}", version)
    return Cost(to_pusd(price.total_price), None, version)


def _priced_usage(usage: TokenUsage) -> PricedUsage:
    """Our disjoint counts in genai-prices' terms, where input includes cache reads and
    writes and output includes reasoning. A count the provider did not send is 0 there."""
    from genai_prices import Usage

    cache_read = usage.cache_read_tokens or 0
    cache_write = usage.cache_write_tokens or 0
    reasoning = usage.reasoning_tokens or 0
    return Usage(
        input_tokens=(usage.input_tokens or 0) + cache_read + cache_write,
        cache_read_tokens=cache_read,
        cache_write_tokens=cache_write,
        output_tokens=(usage.output_tokens or 0) + reasoning,
        output_reasoning_tokens=reasoning,
    )


def _timestamp(at_ns: int) -> datetime:
    seconds, ns = divmod(at_ns, 10**9)
    return datetime.fromtimestamp(seconds, UTC).replace(microsecond=ns // 1000)


def to_pusd(usd: Decimal) -> int:
    """USD as integer pico-USD, rounded half-even."""
    return int((usd * PICO_PER_USD).to_integral_value(ROUND_HALF_EVEN))


def to_usd(pusd: int) -> Decimal:
    """Integer pico-USD as an exact Decimal of USD."""
    return Decimal(pusd).scaleb(-12)
