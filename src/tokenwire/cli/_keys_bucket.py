"""``tokenwire keys create|list|revoke|set|set-tenant``: the broker's keys bucket.

Every gateway watches the bucket and applies a change within a second (ADR 0041). ``create``
prints the new key once, on stdout (nothing else there; the notes go to stderr) and stores
only its hash; ``list`` never shows a hash, only its first 8 hex digits. A limit given as
``none`` is removed; an option not given is left as it is. The broker is the one
``TOKENWIRE_NATS_URL`` names (or the running ``tokenwire up``'s).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import click
import msgspec
from msgspec import UNSET, UnsetType

from tokenwire.broker import KeyBook, KeysBucket
from tokenwire.cli._common import nats_client, resolve_nats_url, run_command, topology, write_json
from tokenwire.cli._errors import CheckFailedError, NotFoundError, UsageError
from tokenwire.schemas import NO_LIMITS, Budget, KeyRecord, Limits, TenantRecord
from tokenwire.services.gateway import (
    GatewayError,
    KeyChanges,
    KeyEntryExistsError,
    KeyEntryNotFoundError,
    LimitChanges,
    NewKey,
    change_key,
    clear_tenant,
    create_key,
    key_view,
    listing,
    revoke_key,
    set_tenant,
)

NONE = "none"


def _in_bucket(work: Callable[[KeyBook], Awaitable[None]]) -> None:
    """Run ``work`` over the keys bucket, its errors as the CLI's."""
    url = resolve_nats_url()

    async def run() -> None:
        async with nats_client(url) as nc:
            try:
                await work(KeysBucket(nc, topology().keys_bucket))
            except KeyEntryNotFoundError as exc:
                raise NotFoundError(exc.message) from None
            except KeyEntryExistsError as exc:
                raise CheckFailedError(exc.message) from None
            except GatewayError as exc:
                raise UsageError(exc.message) from None

    run_command(run)


def _count(value: str | None, flag: str) -> int | UnsetType | None:
    if value is None:
        return UNSET
    if value == NONE:
        return None
    if not value.isdigit() or int(value) < 1:
        raise UsageError(f"{flag} must be a whole number >= 1, or {NONE!r}")
    return int(value)


def _limits(options: dict[str, Any]) -> LimitChanges:
    budget: Budget | UnsetType | None = UNSET
    usd, period = options.pop("budget_usd"), options.pop("budget_period")
    if usd == NONE:
        budget = None
    elif usd is not None:
        budget = _budget(usd, period or "day")
    elif period is not None:
        raise UsageError("--budget-period needs --budget-usd")
    return LimitChanges(
        rpm=_count(options.pop("rpm"), "--rpm"),
        tpm=_count(options.pop("tpm"), "--tpm"),
        concurrent=_count(options.pop("concurrent"), "--concurrent"),
        budget=budget,
    )


def _budget(usd: str, period: str) -> Budget:
    try:
        return msgspec.convert({"usd": usd, "period": period}, Budget)
    except msgspec.ValidationError:
        raise UsageError("--budget-usd must be dollars like 5 or 0.25") from None


def _limit_options(f: Callable[..., None]) -> Callable[..., None]:
    for flag, what in (
        ("--rpm", "requests per minute"),
        ("--tpm", "tokens (input + output) per minute"),
        ("--concurrent", "concurrent streams"),
    ):
        f = click.option(flag, metavar="N|none", help=f"At most N {what}.")(f)
    f = click.option("--budget-usd", metavar="USD|none", help="Spend allowed per period.")(f)
    return click.option("--budget-period", type=click.Choice(["day", "month"]))(f)


def _models(value: str | None) -> list[str] | UnsetType | None:
    if value is None:
        return UNSET
    if value == "all":
        return None
    return [m.strip() for m in value.split(",") if m.strip()]


@click.command("create")
@click.argument("name")
@click.option("--tenant", help="Its tenant (default: its name, for a tenant key).")
@click.option("--operator", is_flag=True, help="It reads every tenant's sessions, manages keys.")
@click.option("--expires-at", metavar="RFC3339", help="When it stops working (2027-01-31T00:00Z).")
@click.option("--models", metavar="M,M|all", help="The models it may call (a trailing * matches).")
@click.option("--json", "as_json", is_flag=True, help="Print the key and its record as JSON.")
@_limit_options
def create(name: str, as_json: bool, **options: Any) -> None:
    """Create key NAME: print the new key once; the bucket keeps only its hash."""
    limits = _limits(options).applied(NO_LIMITS)
    models = _models(options["models"])
    new = NewKey(
        name=name,
        tenant=options["tenant"],
        scope="operator" if options["operator"] else "tenant",
        expires_at=options["expires_at"],
        models=None if isinstance(models, UnsetType) else models,
        limits=limits,
    )

    async def work(book: KeyBook) -> None:
        key, record = await create_key(book, new)
        if as_json:
            write_json({"key": key, "record": key_view(record)})
        else:
            click.echo(key)
        click.echo(
            f"tokenwire: key {record.name} created; it is shown only now (the bucket keeps its"
            " hash)",
            err=True,
        )

    _in_bucket(work)


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per key and tenant.")
def list_keys(as_json: bool) -> None:
    """List the keys (never a hash: its first 8 hex digits) and the tenants' limits."""

    async def work(book: KeyBook) -> None:
        keys, tenants = await listing(book)
        if as_json:
            for key in keys:
                write_json({"key": key_view(key)})
            for tenant in tenants:
                write_json({"tenant": msgspec.to_builtins(tenant)})
            return
        _print(keys, tenants)

    _in_bucket(work)


def _print(keys: list[KeyRecord], tenants: list[TenantRecord]) -> None:
    head = ("NAME", "TENANT", "SCOPE", "EXPIRES", "MODELS", "LIMITS", "SHA256")
    rows = [head]
    for k in keys:
        models = ",".join(k.models) if k.models is not None else "all"
        tenant = k.tenant or ("-" if k.scope == "operator" else k.name)
        expires = k.expires_at or "never"
        shown = (k.name, tenant, k.scope, expires, models, _shown(k.limits), k.sha256[:8] + "...")
        rows.append(shown)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    for row in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    if not keys:
        click.echo("(no keys in the bucket)")
    for t in tenants:
        click.echo(f"tenant {t.name}: {_shown(t.limits)}")


def _shown(limits: Limits) -> str:
    parts = [
        f"{name}={value}"
        for name, value in (
            ("rpm", limits.rpm),
            ("tpm", limits.tpm),
            ("concurrent", limits.concurrent),
        )
        if value is not None
    ]
    if limits.budget is not None:
        parts.append(f"budget=${limits.budget.usd}/{limits.budget.period}")
    return " ".join(parts) or "none"


@click.command("revoke")
@click.argument("name")
def revoke(name: str) -> None:
    """Revoke key NAME: every gateway refuses it within a second."""

    async def work(book: KeyBook) -> None:
        await revoke_key(book, name)
        click.echo(f"tokenwire: key {name} revoked", err=True)

    _in_bucket(work)


@click.command("set")
@click.argument("name")
@click.option("--tenant", metavar="T|none", help="Its tenant (none: its own name).")
@click.option("--scope", type=click.Choice(["tenant", "operator"]), help="Its scope.")
@click.option("--expires-at", metavar="RFC3339|none", help="When it stops working.")
@click.option("--models", metavar="M,M|all", help="The models it may call (a trailing * matches).")
@_limit_options
def set_key(name: str, **options: Any) -> None:
    """Change key NAME's tenant, scope, expiry, models or limits (only those given)."""
    limits = _limits(options)
    tenant, expires = options["tenant"], options["expires_at"]
    changes = KeyChanges(
        tenant=UNSET if tenant is None else (None if tenant == NONE else tenant),
        scope=UNSET if options["scope"] is None else options["scope"],
        expires_at=UNSET if expires is None else (None if expires == NONE else expires),
        models=_models(options["models"]),
        limits=limits if limits != LimitChanges() else UNSET,
    )

    async def work(book: KeyBook) -> None:
        record = await change_key(book, name, changes)
        click.echo(f"tokenwire: key {name} set: {_shown(record.limits)}", err=True)

    _in_bucket(work)


@click.command("set-tenant")
@click.argument("name")
@click.option("--clear", is_flag=True, help="Remove the tenant's limits altogether.")
@_limit_options
def set_tenant_limits(name: str, clear: bool, **options: Any) -> None:
    """Set the limits every key of tenant NAME shares (only those given)."""
    limits = _limits(options)

    async def work(book: KeyBook) -> None:
        if clear:
            await clear_tenant(book, name)
            click.echo(f"tokenwire: tenant {name}'s limits removed", err=True)
            return
        record = await set_tenant(book, name, limits)
        click.echo(f"tokenwire: tenant {name}: {_shown(record.limits)}", err=True)

    _in_bucket(work)


BUCKET_COMMANDS = (create, list_keys, revoke, set_key, set_tenant_limits)
