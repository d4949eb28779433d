"""Hours of replay from a stream's config and state (``tokenwire status``), worked by hand."""

from __future__ import annotations

import pytest

from tokenwire.cli._retention import MIN_SPAN_S, format_replay, shard_retention, total_retention
from tokenwire.config import ConfigError, load, parse_bytes

GIB = 1024**3
DAY_NS = 24 * 3600 * 10**9


def _state(held: int, first: str, last: str, messages: int = 1000) -> dict[str, object]:
    return {"bytes": held, "messages": messages, "first_ts": first, "last_ts": last}


def test_the_byte_budget_bounds_the_reach_at_the_retained_rate() -> None:
    # 36 MB over one hour (nanosecond times, as the server writes them) is 10,000 B/s; a 1 GiB
    # budget then holds 107,374.18 s = 29.83 h, less than the 7-day max age.
    state = _state(36_000_000, "2026-12-04T10:00:00.123456789Z", "2026-12-04T11:00:00.123456789Z")
    r = shard_retention({"max_bytes": GIB, "max_age": 7 * DAY_NS}, state)
    assert r["rate_bytes_per_s"] == pytest.approx(10_000.0)
    assert r["hours"] == pytest.approx(GIB / 10_000 / 3600)
    assert r["bounded_by"] == "max_bytes"
    assert r["full"] is False


def test_the_max_age_bounds_a_slow_stream_and_a_full_one_is_flagged() -> None:
    # 1 MB per day: a 1 GiB budget would last ~3 years, the 1-day max age wins.
    slow = _state(1_000_000, "2026-12-03T00:00:00Z", "2026-12-04T00:00:00Z")
    r = shard_retention({"max_bytes": GIB, "max_age": DAY_NS}, slow)
    assert r["hours"] == pytest.approx(24.0)
    assert r["bounded_by"] == "max_age"
    at_budget = _state(GIB, "2026-12-04T00:00:00Z", "2026-12-04T02:00:00Z")
    full = shard_retention({"max_bytes": GIB, "max_age": 7 * DAY_NS}, at_budget)
    assert full["full"] is True
    assert full["hours"] == pytest.approx(2.0)  # at its budget the window is the reach


def test_no_estimate_from_too_short_a_window() -> None:
    short = _state(5000, "2026-12-04T00:00:00Z", "2026-12-04T00:00:30Z")
    r = shard_retention({"max_bytes": GIB, "max_age": DAY_NS}, short)
    assert r["span_s"] == 30.0 < MIN_SPAN_S
    assert r["hours"] is None
    assert "unknown" in format_replay(r)
    never = "0001-01-01T00:00:00Z"  # what the server says of an empty stream
    empty_state = {"bytes": 0, "messages": 0, "first_ts": never, "last_ts": never}
    empty = shard_retention({"max_bytes": GIB, "max_age": DAY_NS}, empty_state)
    assert empty["hours"] is None


def test_all_shards_add_budgets_and_rates_and_name_the_weakest_shard() -> None:
    age = {"max_age": 7 * DAY_NS}
    busy = shard_retention(  # 20,000 B/s on a 1 GiB share: 14.9 h
        {"max_bytes": GIB, **age},
        _state(72_000_000, "2026-12-04T10:00:00Z", "2026-12-04T11:00:00Z"),
    )
    calm = shard_retention(  # 5,000 B/s on a 1 GiB share: 59.7 h
        {"max_bytes": GIB, **age},
        _state(18_000_000, "2026-12-04T10:00:00Z", "2026-12-04T11:00:00Z"),
    )
    total = total_retention([{"replay": busy}, {"replay": calm}])
    assert total["budget_bytes"] == 2 * GIB
    assert total["rate_bytes_per_s"] == pytest.approx(25_000.0)
    assert total["hours"] == pytest.approx(2 * GIB / 25_000 / 3600)  # 23.9 h
    assert total["min_shard_hours"] == pytest.approx(GIB / 20_000 / 3600)
    assert "MB/s" in format_replay(total)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4GiB", 4 * GIB),
        ("512MiB", 512 * 1024**2),
        ("10GB", 10 * 10**9),
        ("4096", 4096),
        ("1 tib", 1024**4),
    ],
)
def test_sizes_parse_in_binary_and_decimal_units(text: str, size: int) -> None:
    assert parse_bytes("TOKENWIRE_RETENTION_BYTES", text) == size


@pytest.mark.parametrize("text", ["", "0", "-1GiB", "4 GiBs", "lots"])
def test_a_malformed_size_is_refused_naming_the_variable(text: str) -> None:
    with pytest.raises(ConfigError, match="TOKENWIRE_RETENTION_BYTES"):
        parse_bytes("TOKENWIRE_RETENTION_BYTES", text)


def test_the_shared_settings_carry_the_layout_and_the_budget() -> None:
    s = load(
        {
            "TOKENWIRE_SHARDS": "4",
            "TOKENWIRE_SHARD_TAGS": "a, b,,c",
            "TOKENWIRE_RETENTION_BYTES": "64GiB",
            "TOKENWIRE_COMPRESSION": "NONE",
        }
    )
    assert (s.shards, s.shard_tags, s.retention_bytes, s.compression) == (
        4,
        ("a", "b", "c"),
        64 * GIB,
        "none",
    )
    with pytest.raises(ConfigError, match="TOKENWIRE_SHARDS"):
        load({"TOKENWIRE_PARTITIONS": "8", "TOKENWIRE_SHARDS": "9"})
    with pytest.raises(ConfigError, match="TOKENWIRE_COMPRESSION"):
        load({"TOKENWIRE_COMPRESSION": "zstd"})
