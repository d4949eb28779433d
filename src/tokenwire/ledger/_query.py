"""What a usage query can ask: a grouping and the first UTC day to count."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from typing import Literal, get_args

from tokenwire.ledger._errors import InvalidUsageQuery

UsageBy = Literal["model", "provider", "key", "tenant", "session", "day"]
"""How usage is grouped. ``model`` groups by provider and model (``openai/gpt-4o`` and
``azure/gpt-4o`` are priced apart); ``key`` by the gateway key's name."""

USAGE_BY: tuple[UsageBy, ...] = get_args(UsageBy)
MAX_DAYS = 36_600
_RELATIVE = re.compile(r"(\d{1,5})d")


def usage_by(value: str) -> UsageBy:
    """``value`` as a grouping, or InvalidUsageQuery naming the accepted ones."""
    for by in USAGE_BY:
        if value == by:
            return by
    raise InvalidUsageQuery("by", value, f"one of {', '.join(USAGE_BY)}")


def day_of(time_ns: int) -> str:
    """The UTC date (``YYYY-MM-DD``) of a Unix time in ns."""
    return datetime.fromtimestamp(time_ns // 10**9, UTC).date().isoformat()


def parse_since(value: str, today: date) -> str:
    """The first UTC day a ``since`` names: a date ``YYYY-MM-DD``, or ``Nd``, the last N
    days counting ``today`` (``1d`` is today, ``7d`` today and the 6 days before).

    >>> parse_since("7d", date(2026, 3, 10)), parse_since("2026-01-31", date(2026, 3, 10))
    ('2026-03-04', '2026-01-31')
    """
    text = value.strip()
    if (match := _RELATIVE.fullmatch(text)) is not None:
        days = int(match[1])
        if not 1 <= days <= MAX_DAYS:
            raise InvalidUsageQuery("since", value, f"Nd needs 1 <= N <= {MAX_DAYS}")
        return (today - timedelta(days=days - 1)).isoformat()
    try:
        return date.fromisoformat(text).isoformat() if len(text) == 10 else _bad(value)
    except ValueError:
        return _bad(value)


def _bad(value: str) -> str:
    raise InvalidUsageQuery("since", value, "a UTC date YYYY-MM-DD or Nd (the last N days)")
