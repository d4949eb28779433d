"""Gateway keys: who a request's caller is, what it may call and which sessions it may read.

Keys come from the named keys file (``TOKENWIRE_GATEWAY_KEYS_FILE``: TOML entries holding
each key's SHA-256, never the key, with a name, an optional tenant and a scope), the flat
list (``TOKENWIRE_GATEWAY_KEYS``: operators without a tenant) and the broker's keys bucket
(``live_keys.py``). A request's key is hashed once and looked up among the hashes; neither
the key nor its hash is ever logged or echoed. A :class:`Caller` is what the rest of the
gateway sees (``request.state.caller``): its name and tenant go on each step's first chunk,
:func:`may_use` / :func:`may_read` / :func:`visible_tenant` answer what it may call and read.
Without any key every caller is :data:`ANONYMOUS`, an operator. docs/gateway.md, "Keys and
tenants"; ADR 0027, ADR 0041.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from tokenwire.config import ConfigError
from tokenwire.schemas import NO_LIMITS, KeyRecord, Limits, TenantRecord
from tokenwire.variables import GATEWAY_KEYS, GATEWAY_KEYS_FILE

KEYS_FILE_VAR = GATEWAY_KEYS_FILE.env
_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_MAX_FILE_BYTES = 1024 * 1024
_SHOWN_NAMES = 20
"""Key names a log line lists (the count is always whole)."""
Name = Annotated[str, msgspec.Meta(pattern=_NAME_PATTERN)]
Digest = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-fA-F]{64}$")]
Scope = Literal["tenant", "operator"]


@dataclass(frozen=True, slots=True)
class Caller:
    """Who made a request: the key's ``name`` (None without keys), its ``tenant`` (None for a
    key without one) and whether it is an ``operator`` (reads every tenant's sessions).

    A tenant-scoped caller always has a tenant (its key's, or the key's name)."""

    name: str | None
    tenant: str | None
    operator: bool
    limits: Limits = NO_LIMITS
    """The key's own limits (:class:`~tokenwire.schemas.Limits`)."""
    tenant_limits: Limits = NO_LIMITS
    """The limits every key of ``tenant`` shares."""
    expires_at_ns: int | None = None
    """When the key stops being accepted (Unix ns), None: never."""
    models: tuple[str, ...] | None = None
    """The models the key may call (a name, or a prefix ending in ``*``), None: every one."""


ANONYMOUS = Caller(name=None, tenant=None, operator=True)
"""The caller of a gateway without keys (loopback only): an operator without a name."""


def may_read(caller: Caller, tenant: str | None) -> bool:
    """Whether ``caller`` may read a session whose tenant is ``tenant`` (None: a session
    recorded without one, which only operators read)."""
    return caller.operator or (tenant is not None and tenant == caller.tenant)


def visible_tenant(caller: Caller) -> str | None:
    """The one tenant whose records ``caller`` may read, or None when it reads all of them
    (an operator). Filters of rows by tenant use it: ``WHERE tenant = ?`` unless None."""
    return None if caller.operator else caller.tenant


def may_use(caller: Caller, model: str) -> bool:
    """Whether ``caller`` may call ``model`` (the ``model`` of its request as sent)."""
    if caller.models is None:
        return True
    return any(
        model == allowed or (allowed.endswith("*") and model.startswith(allowed[:-1]))
        for allowed in caller.models
    )


def expiry_ns(text: str) -> int:
    """An RFC 3339 time with its offset (``2026-12-31T00:00:00Z``) as Unix ns; ValueError."""
    when = datetime.fromisoformat(text)
    if when.tzinfo is None:
        raise ValueError(f"{text!r} has no UTC offset (end it with Z or +00:00)")
    return int(when.timestamp() * 1_000_000) * 1000


def key_digest(key: str) -> bytes:
    """The SHA-256 of a key's UTF-8 bytes (what the keys file holds, as hex)."""
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True, slots=True)
class NamedKey:
    """One configured key: its SHA-256 ``digest`` and the :class:`Caller` it makes."""

    digest: bytes = field(repr=False)
    caller: Caller


def flat_keys(keys: Iterable[str]) -> tuple[NamedKey, ...]:
    """The keys of ``TOKENWIRE_GATEWAY_KEYS``: operators without a tenant, each named
    ``key-<first 8 hex digits of its SHA-256>`` (stable across list edits)."""
    named = []
    for key in sorted(keys):
        digest = key_digest(key)
        named.append(NamedKey(digest, Caller(f"key-{digest.hex()[:8]}", None, operator=True)))
    return tuple(named)


class KeyRing:
    """The accepted keys; :meth:`match` finds a request's. A ring is *keyed* (every request
    needs a key) when it holds any key, or when ``keyed`` says so: a gateway that had keys
    never falls back to keyless when the last one is revoked."""

    def __init__(self, keys: Iterable[NamedKey], *, keyed: bool = False) -> None:
        self._keys = tuple(keys)
        self._keyed = keyed or bool(self._keys)
        self._by_digest = {k.digest: k.caller for k in self._keys}
        self.tenants = any(k.caller.tenant is not None for k in self._keys)
        """Whether any key has a tenant (else every session is tenant-less: no ownership)."""

    def __bool__(self) -> bool:
        return self._keyed

    def __len__(self) -> int:
        return len(self._keys)

    def names(self) -> list[str]:
        """The keys' names, in configuration order (never a key or a hash: a flat key's name
        is ``key-`` and 8 hex digits of its SHA-256, what it is recorded under)."""
        return [k.caller.name or "" for k in self._keys]

    def summary(self) -> str:
        """One line for the log: how many keys, and their names."""
        if not self._keys:
            if self._keyed:
                return "no gateway keys: every request refused until one is created"
            return "no gateway keys: loopback only, every caller an operator"
        names = self.names()
        shown = ", ".join(names[:_SHOWN_NAMES]) + (" ..." if len(names) > _SHOWN_NAMES else "")
        tenants = " (with tenants)" if self.tenants else ""
        return f"{len(names)} gateway key{'s' if len(names) != 1 else ''}{tenants}: {shown}"

    def match(self, offered: str) -> Caller | None:
        """The caller of ``offered``, or None: one lookup by its SHA-256. A lookup's timing
        can only tell about digests near the offered key's own, which a caller cannot steer
        (a SHA-256 preimage): it reveals nothing of any configured key."""
        return self._by_digest.get(key_digest(offered))


def offered_key(headers: Mapping[str, str]) -> str | None:
    """The key a request carries: ``Authorization: Bearer KEY`` (OpenAI), else ``x-api-key``
    (Anthropic)."""
    auth = headers.get("authorization", "")
    offered = auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get("x-api-key")
    return offered or None


# -- the keys file ------------------------------------------------------------------------


class KeysFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A keys file's records: ``[[keys]]`` and ``[[tenants]]``."""

    keys: list[KeyRecord] = []
    tenants: list[TenantRecord] = []


def load_keys_file(path: str) -> tuple[NamedKey, ...]:
    """The named keys of a TOML keys file; :class:`ConfigError` naming the file and, for a
    bad entry, its position and field (never a hash)."""
    return parse_keys(_read(path), path)


def load_keys_records(path: str) -> KeysFile:
    """A keys file's records, checked as :func:`load_keys_file` checks them."""
    data = _read(path)
    parse_keys(data, path)
    return _records(data, path)


def _read(path: str) -> bytes:
    try:
        with Path(path).open("rb") as handle:
            data = handle.read(_MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(KEYS_FILE_VAR, path, f"cannot read it: {exc.strerror}") from None
    if len(data) > _MAX_FILE_BYTES:
        raise ConfigError(KEYS_FILE_VAR, path, f"larger than {_MAX_FILE_BYTES} bytes")
    return data


def parse_keys(data: bytes, path: str = "<keys>") -> tuple[NamedKey, ...]:
    """The named keys of a keys file's bytes (see the module); :class:`ConfigError`."""
    parsed = _records(data, path)
    return _named(parsed.keys, {t.name: t.limits for t in parsed.tenants}, path)


def _records(data: bytes, path: str) -> KeysFile:
    try:
        return msgspec.toml.decode(data, type=KeysFile)
    except msgspec.ValidationError as exc:
        raise ConfigError(KEYS_FILE_VAR, path, _validation(exc)) from None
    except msgspec.DecodeError:
        raise ConfigError(KEYS_FILE_VAR, path, "not a TOML file") from None


def _validation(exc: msgspec.ValidationError) -> str:
    """msgspec's message (it never quotes a string that failed its pattern), or for a
    pattern, what the field must look like."""
    text = str(exc)
    where = text.rpartition(" - at `")[2].rstrip("`")
    if "matching regex" in text:
        return f"{where}: malformed (names: 1-64 letters, digits, '.', '_', '-'; sha256: 64 hex)"
    return text


def _named(
    entries: list[KeyRecord], tenants: Mapping[str, Limits], path: str
) -> tuple[NamedKey, ...]:
    names: set[str] = set()
    digests: set[bytes] = set()
    keys = []
    for index, entry in enumerate(entries):
        digest = bytes.fromhex(entry.sha256)
        if entry.name in names:
            raise ConfigError(KEYS_FILE_VAR, path, f"$.keys[{index}].name: used twice")
        if digest in digests:
            raise ConfigError(KEYS_FILE_VAR, path, f"$.keys[{index}].sha256: the same key twice")
        names.add(entry.name)
        digests.add(digest)
        try:
            keys.append(named_key(entry, tenants))
        except ValueError as exc:
            raise ConfigError(KEYS_FILE_VAR, path, f"$.keys[{index}].expires_at: {exc}") from None
    return tuple(keys)


def named_key(record: KeyRecord, tenants: Mapping[str, Limits]) -> NamedKey:
    """The key ``record`` describes, with its tenant's limits from ``tenants``; ValueError
    for an ``expires_at`` that is not an RFC 3339 time with its offset."""
    operator = record.scope == "operator"
    tenant = record.tenant if record.tenant is not None or operator else record.name
    shared = tenants.get(tenant, NO_LIMITS) if tenant is not None else NO_LIMITS
    caller = Caller(
        record.name,
        tenant,
        operator,
        limits=record.limits,
        tenant_limits=shared,
        expires_at_ns=None if record.expires_at is None else expiry_ns(record.expires_at),
        models=None if record.models is None else tuple(record.models),
    )
    return NamedKey(bytes.fromhex(record.sha256), caller)


def key_ring(flat: Iterable[str], named: Iterable[NamedKey]) -> KeyRing:
    """Both sources as one ring; :class:`ConfigError` when a key or a name is in both."""
    flat_named = flat_keys(flat)
    named = tuple(named)
    digests = {k.digest for k in named}
    names = {k.caller.name for k in named}
    for key in flat_named:
        if key.digest in digests:
            why = f"a key is also in {KEYS_FILE_VAR}"
            raise ConfigError(GATEWAY_KEYS.env, "[redacted]", why)
        if key.caller.name in names:
            why = f"the name {key.caller.name} is a {GATEWAY_KEYS.env} key's"
            raise ConfigError(KEYS_FILE_VAR, "[redacted]", why)
    return KeyRing((*flat_named, *named))
