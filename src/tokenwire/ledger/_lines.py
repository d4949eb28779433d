"""The ledger's records: one line per step, and the totals of a group of lines."""

from __future__ import annotations

from decimal import Decimal
from typing import Literal

import msgspec

from tokenwire.ledger._cost import PriceSource, to_usd
from tokenwire.schemas import TokenUsage

TOKEN_FIELDS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
)
"""The disjoint token counts of :class:`~tokenwire.schemas.TokenUsage`, in column order."""


class StepUsage(msgspec.Struct, frozen=True):
    """One step's line in the ledger.

    ``key_name`` and ``tenant`` are the step owner's (from its first chunk; ``None`` when the
    gateway had no named keys), ``day`` the UTC date of ``time_ns``, the step's first chunk
    time. ``usage`` is what the provider reported (``None``: no usage chunk; a count it did
    not send stays ``None``). ``cost_pusd`` is in pico-USD, ``None`` with ``cost_reason``
    when the step could not be priced; ``price_version`` names the price data used and
    ``price_source`` which kind it was (``genai-prices``, or ``deployment``: the routes file's
    price of the deployment that served the step).
    """

    session: str
    turn: int
    step: int
    provider: str
    model: str
    key_name: str | None
    tenant: str | None
    day: str
    time_ns: int
    outcome_kind: Literal["message", "error"]
    usage: TokenUsage | None
    cost_pusd: int | None
    cost_reason: str | None
    price_version: str
    price_source: PriceSource = "genai-prices"

    @property
    def cost_usd(self) -> Decimal | None:
        """The cost as an exact Decimal of USD, or None."""
        return None if self.cost_pusd is None else to_usd(self.cost_pusd)


class UsageTotals(msgspec.Struct, frozen=True):
    """The sums over a group of lines.

    ``steps`` counts every line; ``reported`` those whose provider sent usage; ``priced``
    those with a cost. Token sums add the counts that were reported (an absent count adds
    nothing); ``cost_pusd`` adds the priced lines only, so ``steps - priced`` lines are
    missing from it (``unpriced``).
    """

    steps: int = 0
    reported: int = 0
    priced: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    cost_pusd: int = 0

    @property
    def unpriced(self) -> int:
        """Lines without a cost (not in ``cost_pusd``)."""
        return self.steps - self.priced

    @property
    def cost_usd(self) -> Decimal | None:
        """The priced lines' cost in USD; None when no line of the group was priced."""
        return to_usd(self.cost_pusd) if self.priced else None

    def tokens(self) -> int:
        """Every token counted, all kinds (the counts are disjoint)."""
        return sum(getattr(self, name) for name in TOKEN_FIELDS)

    def __add__(self, other: UsageTotals) -> UsageTotals:
        """The totals of both groups."""
        fields = self.__struct_fields__
        return UsageTotals(*(getattr(self, f) + getattr(other, f) for f in fields))


def line_totals(line: StepUsage) -> UsageTotals:
    """One line as totals (a group of one)."""
    usage = line.usage
    counts = {n: (getattr(usage, n) or 0) if usage is not None else 0 for n in TOKEN_FIELDS}
    return UsageTotals(
        steps=1,
        reported=int(usage is not None),
        priced=int(line.cost_pusd is not None),
        cost_pusd=line.cost_pusd or 0,
        **counts,
    )


class UsageGroup(msgspec.Struct, frozen=True):
    """The totals of one group of a usage query. ``key`` is the group's value (a model as
    ``provider/model``, a day as ``YYYY-MM-DD``); ``None`` for lines without one (no key
    name, no tenant)."""

    key: str | None
    totals: UsageTotals
