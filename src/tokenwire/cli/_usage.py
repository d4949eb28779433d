"""``tokenwire usage``: tokens and cost from the store's ledger, grouped, or one session's steps.

Reads only the store (the ledger's rollup, docs/ledger.md): no broker needed. A table by
default, ``--json`` for one JSON object (the shape of ``GET /v1/usage``).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import click
import msgspec

from tokenwire.cli._common import checked_session, opened_store, resolve_store_url, run_command
from tokenwire.cli._errors import NotFoundError, UsageError
from tokenwire.cli._flags import variable_flags
from tokenwire.ledger import (
    TOKEN_FIELDS,
    USAGE_BY,
    InvalidUsageQuery,
    UsageBy,
    parse_since,
    session_report,
    usage_by,
    usage_report,
)

_TOKEN_HEADS = ("input", "output", "cache read", "cache write", "reasoning")


@click.command()
@click.option(
    "--by",
    "by",
    type=click.Choice(USAGE_BY),
    default=None,
    help="Group by this dimension [default: model, as provider/model].",
)
@click.option("--since", help="First UTC day counted: YYYY-MM-DD, or Nd (the last N days).")
@click.option("--tenant", help="Only this tenant's steps ('' for those without a tenant).")
@click.option("--session", help="List this session's steps with their tokens and cost instead.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@variable_flags("usage")
def usage(
    by: str | None, since: str | None, tenant: str | None, session: str | None, as_json: bool
) -> None:
    """Show tokens and cost from the usage ledger, grouped, or per step of one session.

    Costs come from genai-prices at the time each step streamed; a step it could not price
    (no usage reported, no price for the model) counts as "unpriced", never as a guess.
    """
    url = resolve_store_url()
    if session is not None:
        if by is not None or since is not None or tenant is not None:
            raise UsageError(
                "--session lists one session's steps: it takes no --by, --since or --tenant"
            )
        name = checked_session(session)
        run_command(lambda: _session(url, name, as_json))
        return
    try:
        grouping = usage_by(by or "model")
        first = parse_since(since, datetime.now(UTC).date()) if since is not None else None
    except InvalidUsageQuery as exc:
        raise UsageError(str(exc)) from exc
    run_command(lambda: _grouped(url, grouping, first, tenant, as_json))


async def _grouped(
    url: str, by: UsageBy, since: str | None, tenant: str | None, as_json: bool
) -> None:
    async with opened_store(url) as store:
        groups = await store.usage(by, since, tenant)
    report = usage_report(by, groups, since, tenant)
    if as_json:
        click.echo(msgspec.json.encode(report).decode())
        return
    rows = [_cells(str(r[by]) if r[by] is not None else "(none)", r) for r in report["rows"]]
    _print_table(
        [by, "steps", *_TOKEN_HEADS, "cost USD", "unpriced"],
        [*rows, _cells("total", report["total"])],
    )
    if since is not None:
        click.echo(f"since {since} (UTC)")


async def _session(url: str, session: str, as_json: bool) -> None:
    async with opened_store(url) as store:
        lines = await store.session_usage(session)
        where = store.url
    if not lines:
        raise NotFoundError(f"session {session!r} has no usage lines in {where}")
    report = session_report(session, lines)
    if as_json:
        click.echo(msgspec.json.encode(report).decode())
        return
    rows = [
        [
            f"{s['turn']}/{s['step']}",
            f"{s['provider']}/{s['model']}",
            s["outcome"],
            *_counts(s),
            _cost(s["cost_usd"]),
            s["cost_reason"] or s["price_version"],
        ]
        for s in report["steps"]
    ]
    total = report["total"]
    rows.append(["total", "", "", *_counts(total), _cost(total["cost_usd"]), ""])
    _print_table(["turn/step", "model", "outcome", *_TOKEN_HEADS, "cost USD", "priced by"], rows)


def _cells(label: str, sums: dict[str, Any]) -> list[str]:
    return [
        label,
        str(sums["steps"]),
        *_counts(sums),
        _cost(sums["cost_usd"]),
        str(sums["unpriced"]),
    ]


def _counts(sums: dict[str, Any]) -> list[str]:
    """Token counts; a count that was not reported shows as ``-``."""
    return [str(sums[n]) if sums[n] is not None else "-" for n in TOKEN_FIELDS]


def _cost(usd: float | None) -> str:
    return "-" if usd is None else f"{usd:.6f}"


def _print_table(heads: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Columns aligned: the first ones left, the numbers right, the last one left."""
    widths = [max(len(str(r[i])) for r in [heads, *rows]) for i in range(len(heads))]
    numeric = {
        i for i, h in enumerate(heads) if h in (*_TOKEN_HEADS, "steps", "cost USD", "unpriced")
    }
    for row in [heads, *rows]:
        cells = [
            str(c).rjust(w) if i in numeric else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        click.echo("  ".join(cells).rstrip())
