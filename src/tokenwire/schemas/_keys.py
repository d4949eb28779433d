"""Gateway keys as records: what a key may do and how much (the keys file and the keys bucket).

A :class:`KeyRecord` holds a key's SHA-256 (never the key), its tenant, scope, expiry, allowed
models and :class:`Limits`; a :class:`TenantRecord` holds the limits every key of one tenant
shares. The keys file (TOML) and the broker's keys bucket hold the same records.
docs/gateway.md, "Keys and tenants"; ADR 0027.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

KeyName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")]
Digest = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-fA-F]{64}$")]
Scope = Literal["tenant", "operator"]
Period = Literal["day", "month"]
Count = Annotated[int, msgspec.Meta(ge=1, le=2**31)]
Usd = Annotated[str, msgspec.Meta(pattern=r"^[0-9]{1,9}(\.[0-9]{1,12})?$")]


class Budget(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Spend allowed per calendar ``period`` (UTC), in US dollars as a decimal string."""

    usd: Usd
    period: Period = "day"


class Limits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Requests and tokens (input + output) per minute, concurrent streams, and a budget;
    ``None`` is no limit."""

    rpm: Count | None = None
    tpm: Count | None = None
    concurrent: Count | None = None
    budget: Budget | None = None


NO_LIMITS = Limits()


class KeyRecord(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One key: ``expires_at`` is RFC 3339 (UTC) or None; ``models`` None allows every model."""

    name: KeyName
    sha256: Digest
    tenant: KeyName | None = None
    scope: Scope = "tenant"
    expires_at: str | None = None
    models: list[str] | None = None
    limits: Limits = NO_LIMITS


class TenantRecord(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The limits that every key of tenant ``name`` shares."""

    name: KeyName
    limits: Limits = NO_LIMITS
