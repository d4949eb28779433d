"""The ledger's rows: a step's usage line, the daily rollup deltas, and the usage queries.

Shared by every backend, as ``_backend_rows`` is for steps. A line is derived from the
:class:`StepRecord` alone (its outcome's usage, its first chunk's owner and time), so the
assembler and ``tokenwire rebuild``, which both commit records, write the same line.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import assert_never

import msgspec

from tokenwire.ledger import (
    TOKEN_FIELDS,
    StepUsage,
    UsageBy,
    UsageGroup,
    UsageTotals,
    day_of,
    line_totals,
    price_step,
)
from tokenwire.schemas import ChunkEnvelope, Routed, TokenUsage
from tokenwire.store._records import StepRecord

LINE_COLUMNS = (
    "session",
    "turn",
    "step",
    "provider",
    "model",
    "key_name",
    "tenant",
    "day",
    "time_ns",
    "outcome_kind",
    "reported",
    *TOKEN_FIELDS,
    "cost_pusd",
    "cost_reason",
    "price_version",
    "price_source",
)
ROLLUP_KEY = ("day", "provider", "model", "key_name", "tenant")
ROLLUP_SUMS = ("steps", "reported", "priced", *TOKEN_FIELDS, "cost_pusd")
ROLLUP_COLUMNS = (*ROLLUP_KEY, *ROLLUP_SUMS)
NONE = ""
"""How the rollup stores "no key name" / "no tenant" (its key columns are NOT NULL)."""

RollupKey = tuple[str, str, str, str, str]


def usage_line(record: StepRecord) -> StepUsage:
    """The ledger line of a step: its reported usage, priced at its first chunk's time."""
    first = record.chunks[0] if record.chunks else None
    owner = first if first is not None and first.ordinal == 0 else None
    at_ns = first.time_ns if first is not None else record.completed_ns
    usage = record.outcome.usage
    routed = owner.routed if owner is not None else None
    routed = routed if isinstance(routed, Routed) else None
    cost = price_step(record.provider, record.model, usage, at_ns, routed)
    return StepUsage(
        session=record.session,
        turn=record.turn,
        step=record.step,
        provider=record.provider,
        model=record.model,
        key_name=_owner(owner, "key_name"),
        tenant=_owner(owner, "tenant"),
        day=day_of(at_ns),
        time_ns=at_ns,
        outcome_kind=record.outcome_kind,
        usage=usage,
        cost_pusd=cost.pusd,
        cost_reason=cost.reason,
        price_version=cost.price_version,
        price_source=cost.source,
    )


def _owner(first: ChunkEnvelope | None, name: str) -> str | None:
    value = getattr(first, name, msgspec.UNSET) if first is not None else msgspec.UNSET
    return value if isinstance(value, str) else None


def usage_lines(records: Sequence[StepRecord]) -> list[StepUsage]:
    """The line of every record, in order (priced before the commit's transaction opens)."""
    return [usage_line(record) for record in records]


def line_values(line: StepUsage) -> tuple[object, ...]:
    """A line's values in :data:`LINE_COLUMNS` order."""
    usage = line.usage
    counts = [getattr(usage, n) if usage is not None else None for n in TOKEN_FIELDS]
    return (
        line.session,
        line.turn,
        line.step,
        line.provider,
        line.model,
        line.key_name,
        line.tenant,
        line.day,
        line.time_ns,
        line.outcome_kind,
        int(usage is not None),
        *counts,
        line.cost_pusd,
        line.cost_reason,
        line.price_version,
        line.price_source,
    )


def line_from_row(row: Sequence[object]) -> StepUsage:
    """A line from a row selected in :data:`LINE_COLUMNS` order."""
    values = dict(zip(LINE_COLUMNS, row, strict=True))
    counts = {n: values.pop(n) for n in TOKEN_FIELDS}
    reported = values.pop("reported")
    values["usage"] = TokenUsage(**counts) if reported else None  # type: ignore[arg-type]  # ints or None, read back as written
    return msgspec.convert(values, StepUsage)


def rollup_key(line: StepUsage) -> RollupKey:
    """The rollup row a line adds to."""
    return (line.day, line.provider, line.model, line.key_name or NONE, line.tenant or NONE)


def rollup_deltas(lines: Iterable[StepUsage], sign: int = 1) -> list[tuple[object, ...]]:
    """What ``lines`` add to (``sign=-1``: take from) the rollup, one row per rollup key, in
    key order (two transactions then lock rollup rows in the same order)."""
    sums: dict[RollupKey, UsageTotals] = {}
    for line in lines:
        key = rollup_key(line)
        sums[key] = sums.get(key, UsageTotals()) + line_totals(line)
    return [(*key, *(sign * v for v in msgspec.structs.astuple(sums[key]))) for key in sorted(sums)]


def upsert_rollup(placeholder: str) -> str:
    """The statement adding one delta row to ``usage_daily`` (SQLite ``?``, psycopg ``%s``)."""
    values = ", ".join([placeholder] * len(ROLLUP_COLUMNS))
    updates = ", ".join(f"{c} = usage_daily.{c} + excluded.{c}" for c in ROLLUP_SUMS)
    return (
        f"INSERT INTO usage_daily ({', '.join(ROLLUP_COLUMNS)}) VALUES ({values}) "
        f"ON CONFLICT ({', '.join(ROLLUP_KEY)}) DO UPDATE SET {updates}"
    )


def insert_lines(placeholder: str) -> str:
    """The statement inserting one line into ``step_usage``."""
    values = ", ".join([placeholder] * len(LINE_COLUMNS))
    return f"INSERT INTO step_usage ({', '.join(LINE_COLUMNS)}) VALUES ({values})"


def session_lines_sql(placeholder: str) -> str:
    """A session's lines in the order of its steps."""
    columns = ", ".join(f"u.{c}" for c in LINE_COLUMNS)
    return (
        f"SELECT {columns} FROM step_usage u JOIN steps s"
        " ON s.session = u.session AND s.turn = u.turn AND s.step = u.step"
        f" WHERE u.session = {placeholder} ORDER BY s.position"
    )


_GROUPED: dict[UsageBy, tuple[str, ...]] = {
    "model": ("provider", "model"),
    "provider": ("provider",),
    "key": ("key_name",),
    "tenant": ("tenant",),
    "day": ("day",),
    "session": ("session",),
}


def group_query(
    by: UsageBy, since: str | None, tenant: str | None, placeholder: str
) -> tuple[str, tuple[object, ...]]:
    """The SQL and parameters of a usage query; rows are the group columns, then the sums.

    ``session`` reads the lines; every other grouping reads the daily rollup.
    """
    columns = ", ".join(_GROUPED[by])
    where, params = [f"day >= {placeholder}"], [since or ""]
    if tenant is not None:
        where.append(f"coalesce(tenant, '') = {placeholder}")
        params.append(tenant)
    if by == "session":
        sums = (
            "count(*), sum(reported), count(cost_pusd), "
            + ", ".join(f"sum(coalesce({n}, 0))" for n in TOKEN_FIELDS)
            + ", sum(coalesce(cost_pusd, 0))"
        )
        table = "step_usage"
    else:
        sums = ", ".join(f"sum({c})" for c in ROLLUP_SUMS)
        table = "usage_daily"
    sql = (
        f"SELECT {columns}, {sums} FROM {table} WHERE {' AND '.join(where)}"
        f" GROUP BY {columns} ORDER BY {columns}"
    )
    return sql, tuple(params)


def group_rows(by: UsageBy, rows: Iterable[Sequence[object]]) -> list[UsageGroup]:
    """Rows of :func:`group_query` as groups (database sums may come back as Decimals)."""
    width = len(_GROUPED[by])
    found: dict[tuple[str, ...], UsageTotals] = {}
    for row in rows:
        key = tuple(str(v) if v is not None else NONE for v in row[:width])
        found[key] = UsageTotals(*(int(str(v)) if v is not None else 0 for v in row[width:]))
    # Sorted here, not by the database: its collation would order text differently.
    return [UsageGroup(_group_key(by, [v or None for v in k]), found[k]) for k in sorted(found)]


def _group_key(by: UsageBy, values: list[str | None]) -> str | None:
    match by:
        case "model":
            return f"{values[0]}/{values[1]}"
        case "key" | "tenant":
            return values[0] or None
        case "provider" | "day" | "session":
            return values[0]
        case _:
            assert_never(by)


def group_lines(
    lines: Iterable[StepUsage], by: UsageBy, since: str | None, tenant: str | None
) -> list[UsageGroup]:
    """The same query over lines in memory (the memory store)."""
    sums: dict[tuple[str, ...], UsageTotals] = {}
    for line in lines:
        if line.day < (since or "") or (tenant is not None and (line.tenant or NONE) != tenant):
            continue
        values = line_values(line)
        key = tuple(str(values[LINE_COLUMNS.index(c)] or NONE) for c in _GROUPED[by])
        sums[key] = sums.get(key, UsageTotals()) + line_totals(line)
    return [UsageGroup(_group_key(by, [v or None for v in key]), sums[key]) for key in sorted(sums)]
