"""Managing the keys bucket: create, change, revoke and list keys, and set tenants' limits.

What ``tokenwire keys create|list|revoke|set|set-tenant`` and the operator routes under
``/v1/keys`` and ``/v1/tenants`` do, over a :class:`~tokenwire.broker.KeyBook`. A created key
is random (:func:`new_key`), returned once and stored only as its SHA-256. Every change is a
compare-and-set on the entry's revision, tried again a few times when another writer came
first. A listing never shows a hash, only its first 8 hex digits. ADR 0041.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from tokenwire.broker import EntryKind, KeyBook, KeyEntry
from tokenwire.schemas import NO_LIMITS, Budget, KeyRecord, Limits, TenantRecord
from tokenwire.schemas._keys import Count, KeyName, Scope
from tokenwire.services.gateway._access.keys import expiry_ns, key_digest
from tokenwire.services.gateway._errors import (
    InvalidRequestError,
    KeyEntryExistsError,
    KeyEntryNotFoundError,
)

KEY_PREFIX = "tw-"
_ATTEMPTS = 5


def new_key() -> str:
    """A new gateway key: ``tw-`` and 256 random bits (URL-safe base64)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


class LimitChanges(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The limits to change (absent: unchanged; null: no limit)."""

    rpm: Count | UnsetType | None = UNSET
    tpm: Count | UnsetType | None = UNSET
    concurrent: Count | UnsetType | None = UNSET
    budget: Budget | UnsetType | None = UNSET

    def applied(self, limits: Limits) -> Limits:
        """``limits`` with these changes."""
        return msgspec.structs.replace(limits, **_set_fields(self))


class KeyChanges(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The fields of a key to change (absent: unchanged; null: none)."""

    tenant: KeyName | UnsetType | None = UNSET
    scope: Scope | UnsetType = UNSET
    expires_at: str | UnsetType | None = UNSET
    models: list[str] | UnsetType | None = UNSET
    limits: LimitChanges | UnsetType = UNSET

    def applied(self, record: KeyRecord) -> KeyRecord:
        """``record`` with these changes, checked."""
        fields = _set_fields(self)
        if isinstance(self.limits, LimitChanges):
            fields["limits"] = self.limits.applied(record.limits)
        return checked_key(msgspec.structs.replace(record, **fields))


class NewKey(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a new key is to be (``POST /v1/keys``); its key is made by :func:`create_key`."""

    name: KeyName
    tenant: KeyName | None = None
    scope: Scope = "tenant"
    expires_at: str | None = None
    models: list[str] | None = None
    limits: Limits = NO_LIMITS


def _set_fields(changes: msgspec.Struct) -> dict[str, Any]:
    """The fields ``changes`` sets (not UNSET)."""
    fields = ((n, getattr(changes, n)) for n in changes.__struct_fields__)
    return {name: value for name, value in fields if value is not UNSET}


def checked_key(record: KeyRecord) -> KeyRecord:
    """``record`` when every field holds (the patterns, an RFC 3339 expiry with its offset,
    no empty model name); :class:`InvalidRequestError` naming the field."""
    try:
        record = msgspec.convert(msgspec.to_builtins(record), KeyRecord)
    except msgspec.ValidationError as exc:
        raise InvalidRequestError(str(exc)) from None
    if record.expires_at is not None:
        try:
            expiry_ns(record.expires_at)
        except ValueError as exc:
            raise InvalidRequestError(f"expires_at: {exc}", param="expires_at") from None
    if record.models is not None and not all(m.strip() for m in record.models):
        raise InvalidRequestError("models: an empty model name", param="models")
    return record


async def create_key(book: KeyBook, new: NewKey) -> tuple[str, KeyRecord]:
    """A new random key as ``new`` says, stored as its hash: (the key, its record). A name
    in use is a :class:`KeyEntryExistsError`; a revoked name may be used again."""
    key = new_key()
    fields = msgspec.structs.asdict(new)
    record = checked_key(KeyRecord(sha256=key_digest(key).hex(), **fields))
    held = await book.entry("key", new.name)
    if held is not None and held.record is not None:
        raise KeyEntryExistsError(f"a key named {new.name!r} exists (revoke it first)")
    expected = 0 if held is None else held.revision
    if await book.write("key", new.name, record, expected=expected) is None:
        raise KeyEntryExistsError(f"a key named {new.name!r} was created meanwhile")
    return key, record


async def change_key(book: KeyBook, name: str, changes: KeyChanges) -> KeyRecord:
    """The key ``name`` with ``changes`` (:class:`KeyEntryNotFoundError` when there is none)."""

    def change(entry: KeyEntry | None) -> KeyRecord:
        if entry is None or not isinstance(entry.record, KeyRecord):
            raise KeyEntryNotFoundError(f"no key named {name!r}")
        return changes.applied(entry.record)

    changed = await _swap(book, "key", name, change)
    assert isinstance(changed, KeyRecord)
    return changed


async def revoke_key(book: KeyBook, name: str) -> None:
    """Delete the key ``name``: every gateway refuses it once its watch tells it."""

    def revoke(entry: KeyEntry | None) -> None:
        if entry is None or entry.record is None:
            raise KeyEntryNotFoundError(f"no key named {name!r}")

    await _swap(book, "key", name, revoke)


async def set_tenant(book: KeyBook, name: str, changes: LimitChanges) -> TenantRecord:
    """Tenant ``name``'s limits with ``changes`` (a tenant without an entry has none)."""

    def change(entry: KeyEntry | None) -> TenantRecord:
        held = entry.record if entry is not None else None
        limits = held.limits if isinstance(held, TenantRecord) else NO_LIMITS
        try:
            return msgspec.convert(
                msgspec.to_builtins(TenantRecord(name=name, limits=changes.applied(limits))),
                TenantRecord,
            )
        except msgspec.ValidationError as exc:
            raise InvalidRequestError(str(exc)) from None

    changed = await _swap(book, "tenant", name, change)
    assert isinstance(changed, TenantRecord)
    return changed


async def clear_tenant(book: KeyBook, name: str) -> None:
    """Delete tenant ``name``'s entry: its keys share no limits."""

    def clear(entry: KeyEntry | None) -> None:
        if entry is None or entry.record is None:
            raise KeyEntryNotFoundError(f"no tenant named {name!r}")

    await _swap(book, "tenant", name, clear)


Stored = KeyRecord | TenantRecord | None


async def _swap(
    book: KeyBook, kind: EntryKind, name: str, change: Callable[[KeyEntry | None], Stored]
) -> Stored:
    """Read, change, write on the revision read; again when another writer came first."""
    for _ in range(_ATTEMPTS):
        entry = await book.entry(kind, name)
        record = change(entry)
        expected = 0 if entry is None else entry.revision
        if await book.write(kind, name, record, expected=expected) is not None:
            return record
    raise KeyEntryExistsError(f"{kind} {name!r} kept changing: try again")


async def listing(book: KeyBook) -> tuple[list[KeyRecord], list[TenantRecord]]:
    """Every key and tenant in the bucket (not the deleted ones), by name."""
    keys: list[KeyRecord] = []
    tenants: list[TenantRecord] = []
    for entry in await book.entries():
        if isinstance(entry.record, KeyRecord):
            keys.append(entry.record)
        elif isinstance(entry.record, TenantRecord):
            tenants.append(entry.record)
    return keys, tenants


def key_view(record: KeyRecord) -> dict[str, Any]:
    """A key as a listing shows it: every field but the hash, of which ``sha256_prefix``
    shows 8 hex digits (enough to tell keys apart, nothing to guess one with)."""
    view: dict[str, Any] = msgspec.to_builtins(record)
    view["sha256_prefix"] = view.pop("sha256")[:8]
    return view
