"""The periods limits count in: fixed UTC minutes for requests and tokens, UTC days and
months for budgets. Each is named by a key part (``29543210``, ``2026-12-07``, ``2026-12``)
and ends at a known instant, what ``reset`` headers and refusals tell the caller.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Literal, assert_never

Period = Literal["day", "month"]

MINUTE_S = 60


def minute_of(now_s: float) -> tuple[int, float]:
    """The fixed UTC minute ``now_s`` (Unix seconds) falls in, and the seconds left in it."""
    index = int(now_s // MINUTE_S)
    return index, (index + 1) * MINUTE_S - now_s


def budget_period(period: Period, now_s: float) -> tuple[str, datetime]:
    """The UTC day or month ``now_s`` falls in (its key part) and when the next one starts."""
    return _period_of_day(period, int(now_s // 86400))


@lru_cache(maxsize=64)
def _period_of_day(period: Period, day: int) -> tuple[str, datetime]:
    now = datetime.fromtimestamp(day * 86400, UTC)
    if period == "day":
        start = now.replace(hour=0, minute=0, second=0, microsecond=0)
        return start.strftime("%Y-%m-%d"), start + timedelta(days=1)
    if period == "month":
        start = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
        following = (start + timedelta(days=32)).replace(day=1)
        return start.strftime("%Y-%m"), following
    assert_never(period)


def openai_duration(seconds: float) -> str:
    """A duration as OpenAI's ``x-ratelimit-reset-*`` headers write it: ``1s``, ``6m0s``,
    ``1h2m3s`` (whole seconds, rounded up, at least ``1s``)."""
    whole = max(1, int(-(-seconds // 1)))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"
