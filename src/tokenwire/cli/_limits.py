"""``tokenwire limits``: what each key and tenant used of its limits and budgets, fleet-wide.

Reads the broker's allowances bucket (``tokenwire-limits``, docs/gateway.md, "Limits and
budgets"): this minute's requests and tokens, the streams held now, this period's spend and
what the gateways hold leased; and beside each, its limit from the keys bucket (what every
gateway enforces, ADR 0041). A table by default, ``--json`` for one JSON object.
"""

from __future__ import annotations

import time
from typing import Any

import click
import msgspec

from tokenwire.broker import Allowances, KeyEntry, KeysBucket, Pool
from tokenwire.cli._common import nats_client, resolve_nats_url, run_command, topology
from tokenwire.cli._flags import variable_flags
from tokenwire.ledger import to_usd
from tokenwire.schemas import Limits

_KINDS = {"rpm": "requests/min", "tpm": "tokens/min", "conc": "streams", "usd": "usd"}


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@variable_flags("limits")
def limits(as_json: bool) -> None:
    """Show each key's and tenant's use against its limits and budgets (all gateways)."""
    url = resolve_nats_url()
    rows: list[dict[str, Any]] = []

    async def work() -> None:
        t = topology()
        async with nats_client(url) as nc:
            pools = await Allowances(nc, t.limits_bucket).pools()
            entries = await KeysBucket(nc, t.keys_bucket).entries()
        rows.extend(usage_rows(pools, configured(entries), now_ns=time.time_ns()))

    run_command(work)
    if as_json:
        click.echo(msgspec.json.encode({"rows": rows}).decode())
        return
    click.echo(f"{'scope':<8} {'name':<24} {'counter':<13} {'period':<11} {'used':>14} "
               f"{'held':>14} {'limit':>14}")  # fmt: skip
    for r in rows:
        click.echo(
            f"{r['scope']:<8} {r['name']:<24} {r['counter']:<13} {r['period']:<11} "
            f"{r['used']:>14} {r['held']:>14} {r['limit'] if r['limit'] is not None else '-':>14}"
        )


def configured(entries: list[KeyEntry]) -> dict[tuple[str, str], Limits]:
    """The limits of the keys bucket's keys and tenants, by (scope, name)."""
    found: dict[tuple[str, str], Limits] = {}
    for entry in entries:
        if entry.record is not None:
            found[(entry.kind, entry.name)] = entry.record.limits
    return found


def usage_rows(
    pools: dict[str, Pool], configured: dict[tuple[str, str], Limits], *, now_ns: int
) -> list[dict[str, Any]]:
    """One row per counter in force: this minute's requests and tokens, streams held now,
    every period's spend (a counter of a past minute is left out)."""
    minute = str(now_ns // 10**9 // 60)
    rows = []
    for key, pool in sorted(pools.items()):
        parts = _parts(key)
        if parts is None or (parts[0] in ("rpm", "tpm") and parts[3] != minute):
            continue
        kind, scope, name, period = parts
        held = pool.held(now_ns=now_ns)
        limit = _limit(configured.get((scope, name)), kind)
        money = kind == "usd"
        used = pool.used
        if money:  # a hold that ended unrenewed is spent (its gateway died): ADR 0042
            used += sum(h.amount for h in pool.holds.values()) - held
        rows.append(
            {
                "scope": scope,
                "name": name,
                "counter": _KINDS[kind],
                "period": "this minute" if kind in ("rpm", "tpm") else period,
                "used": f"{to_usd(used):f}" if money else used,
                "held": f"{to_usd(held):f}" if money else held,
                "limit": limit,
            }
        )
    return rows


def _parts(key: str) -> tuple[str, str, str, str] | None:
    """(kind, scope, name, period) of a counter's key (``usd.key.agent.2026-12-07``; a
    stream counter's period is ``now``), None for a key of another shape."""
    kind, _, rest = key.partition(".")
    scope, _, rest = rest.partition(".")
    name, _, period = (rest, "", "now") if kind == "conc" else rest.rpartition(".")
    if kind not in _KINDS or not scope or not name or not period:
        return None
    return kind, scope, name, period


def _limit(limits: Limits | None, kind: str) -> int | str | None:
    if limits is None:
        return None
    if kind == "usd":
        return f"{limits.budget.usd} per {limits.budget.period}" if limits.budget else None
    return {"rpm": limits.rpm, "tpm": limits.tpm, "conc": limits.concurrent}[kind]
