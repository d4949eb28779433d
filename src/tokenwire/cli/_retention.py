"""How many hours of replay the retention budget holds at the current write rate.

A chunk stream keeps its messages until ``max_age`` or ``max_bytes`` (its share of
``TOKENWIRE_RETENTION_BYTES``) discards the oldest, so at a steady write rate ``r`` the reach
is ``min(max_age, max_bytes / r)``. The rate is the mean over the retained window
(``state.bytes / (last_ts - first_ts)``, one stream-info request per stream, no state between
runs); a window shorter than :data:`MIN_SPAN_S` gives no estimate. Over all shards the budget
and the rates add up; ``min_shard_hours`` is what every session is guaranteed. How the
estimate lags and what it counts: docs/operations.md, "Retention".
"""

from __future__ import annotations

import datetime
from typing import Any

MIN_SPAN_S = 60.0
"""A retained window shorter than this gives no rate estimate."""
_FULL = 0.95
"""A stream holding this share of its byte budget is at its budget (``full``)."""
_NS = 1_000_000_000


def shard_retention(config: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """The reach of one stream from its ``STREAM.INFO`` config and state (see the module)."""
    held = int(state.get("bytes", 0))
    span = _span_s(state)
    budget = int(config.get("max_bytes", -1))
    max_age = int(config.get("max_age", 0)) / _NS
    rate = held / span if span >= MIN_SPAN_S and held > 0 else None
    return _reach(held, budget, max_age, span, rate)


def total_retention(streams: list[dict[str, Any]]) -> dict[str, Any]:
    """The layout's reach: budgets and rates summed over the shards' ``replay`` entries."""
    entries = [s["replay"] for s in streams]
    if not entries:
        return _reach(0, -1, 0.0, 0.0, None)
    rates = [e["rate_bytes_per_s"] for e in entries]
    rate = sum(rates) if all(r is not None for r in rates) else None
    budgets = [e["budget_bytes"] for e in entries]
    budget = sum(budgets) if all(b > 0 for b in budgets) else -1
    ages = [e["max_age_s"] for e in entries]
    span = max(e["span_s"] for e in entries)
    total = _reach(sum(e["bytes"] for e in entries), budget, min(ages), span, rate)
    hours = [e["hours"] for e in entries]
    total["min_shard_hours"] = min(hours) if all(h is not None for h in hours) else None
    return total


def _reach(
    held: int, budget: int, max_age: float, span: float, rate: float | None
) -> dict[str, Any]:
    limits: list[tuple[float, str]] = []
    if max_age > 0:
        limits.append((max_age, "max_age"))
    if budget > 0 and rate:
        limits.append((budget / rate, "max_bytes"))
    window, bound = min(limits) if limits and rate else (None, None)
    return {
        "bytes": held,
        "budget_bytes": budget,
        "max_age_s": max_age,
        "span_s": span,
        "rate_bytes_per_s": rate,
        "hours": window / 3600 if window is not None else None,
        "bounded_by": bound,
        "full": budget > 0 and held >= _FULL * budget,
    }


def _span_s(state: dict[str, Any]) -> float:
    """Seconds between the first and the last retained message (0 when fewer than two)."""
    first, last = _time(state.get("first_ts")), _time(state.get("last_ts"))
    if first is None or last is None or int(state.get("messages", 0)) < 2:
        return 0.0
    return max((last - first).total_seconds(), 0.0)


def _time(value: object) -> datetime.datetime | None:
    """An RFC 3339 time as the server writes it (nanoseconds cut to microseconds)."""
    if not isinstance(value, str) or value.startswith("0001-"):
        return None
    text = value.replace("Z", "+00:00")
    head, dot, rest = text.partition(".")
    if dot:
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{head}.{rest[: min(digits, 6)]}{rest[digits:]}"
    try:
        return datetime.datetime.fromisoformat(text)
    except ValueError:
        return None


def format_replay(r: dict[str, Any]) -> str:
    """``~31.2 h at 1.4 MB/s (max_bytes)``, or why there is no estimate yet."""
    if r["hours"] is None:
        return f"unknown (less than {MIN_SPAN_S:.0f} s of data retained)"
    rate = r["rate_bytes_per_s"] or 0.0
    full = ", at its budget" if r["full"] else ""
    return f"~{r['hours']:.1f} h at {rate / 1e6:.3f} MB/s (bounded by {r['bounded_by']}{full})"
