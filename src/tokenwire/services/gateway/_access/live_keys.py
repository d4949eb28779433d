"""Keys that live in the broker: the gateway's key ring, rebuilt as the keys bucket changes.

The ring is the flat list (``TOKENWIRE_GATEWAY_KEYS``: the process's own operators, never in
the bucket), then the keys bucket over the keys file: an entry of the bucket replaces the
file's entry of that name, a deleted one (a revoke) removes it, and a tenant's limits in the
bucket replace the file's. The file seeds the bucket with every name the bucket never held
(compare-and-set on revision 0: a revoked name's delete marker keeps it revoked); a reload of
the file (``SIGHUP``) changes or deletes in the bucket what it changed or removed, where the
bucket still holds the file's old record. ADR 0041.

Every change the watch delivers rebuilds the ring, swapped whole for the next request. Every
``check_s`` the gateway asks the bucket's last revision: unanswered, or a watch that stays
behind it (or a bucket made again, behind the watch), is watched afresh, the last ring kept
meanwhile and :meth:`LiveKeys.stale` saying why (``/readyz``: ``keys-stale``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tokenwire.broker import BoardWatch, BrokerError, EntryKind, KeyBook, KeyEntry, cancel_task
from tokenwire.config import ConfigError
from tokenwire.schemas import KeyRecord, Limits, TenantRecord
from tokenwire.services.gateway._access.keys import KeyRing, NamedKey, named_key

log = logging.getLogger("tokenwire.gateway")

CHECK_S = 1.0
"""How often the gateway checks that its watch of the keys bucket is not behind."""
_START_BOUND_S = 3.0
"""How long the gateway's start waits for the bucket's keys (else it starts on the file's)."""


@dataclass(frozen=True)
class Bootstrap:
    """The keys a gateway has before the bucket: ``flat`` (never in the bucket), ``filed``
    (the keys file's, as callers), the file's ``tenants`` and the ``seeds`` it writes into a
    bucket that never held their names."""

    flat: tuple[NamedKey, ...] = ()
    filed: tuple[NamedKey, ...] = ()
    tenants: Mapping[str, Limits] = field(default_factory=dict)
    seeds: Sequence[KeyRecord | TenantRecord] = ()


Entries = Mapping[tuple[str, str], KeyEntry]


def merged_ring(boot: Bootstrap, entries: Entries, *, keyed: bool) -> tuple[KeyRing, list[str]]:
    """The ring of ``boot`` with the bucket's ``entries`` over the file's (see the module), and
    what was left out and why (a name or a key also among the flat keys, a key twice)."""
    tenants = dict(boot.tenants)
    for (kind, name), entry in entries.items():
        if kind == "tenant":
            tenants.pop(name, None)
            if isinstance(entry.record, TenantRecord):
                tenants[name] = entry.record.limits
    keys = {k.caller.name or "": _retenanted(k, tenants) for k in boot.filed}
    problems: list[str] = []
    for (kind, name), entry in entries.items():
        if kind != "key":
            continue
        keys.pop(name, None)
        if entry.invalid:
            problems.append(f"key {name}: unreadable entry ({entry.invalid[:200]}): refused")
            continue
        if isinstance(entry.record, KeyRecord):
            try:
                keys[name] = named_key(entry.record, tenants)
            except ValueError as exc:
                problems.append(f"key {name}: {exc}: refused")
    ring = _ring(boot.flat, [keys[n] for n in sorted(keys)], problems)
    return KeyRing(ring, keyed=keyed), problems


def _retenanted(key: NamedKey, tenants: Mapping[str, Limits]) -> NamedKey:
    tenant = key.caller.tenant
    if tenant is None:
        return key
    shared = tenants.get(tenant, Limits())
    if shared == key.caller.tenant_limits:
        return key
    return NamedKey(key.digest, dataclasses.replace(key.caller, tenant_limits=shared))


def _ring(
    flat: Sequence[NamedKey], named: Sequence[NamedKey], problems: list[str]
) -> list[NamedKey]:
    names = {k.caller.name for k in flat}
    digests = {k.digest for k in flat}
    kept = list(flat)
    for key in named:
        if key.caller.name in names or key.digest in digests:
            problems.append(f"key {key.caller.name}: its name or key is taken: left out")
            continue
        names.add(key.caller.name)
        digests.add(key.digest)
        kept.append(key)
    return kept


class LiveKeys:
    """One gateway's keys: the bootstrap, the bucket's entries and the ring made of both,
    handed to ``apply`` on every change (see the module). Without a ``book`` (no broker) the
    ring is the bootstrap's, never stale."""

    def __init__(
        self,
        boot: Bootstrap,
        book: KeyBook | None,
        *,
        apply: Callable[[KeyRing], None],
        keyed: bool,
        check_s: float = CHECK_S,
    ) -> None:
        self._boot = boot
        self._book = book
        self._apply = apply
        self._keyed = keyed
        self._check_s = check_s
        self._entries: dict[tuple[str, str], KeyEntry] = {}
        self._pending: dict[tuple[str, str], KeyEntry] | None = None
        self._target = 0
        self._seen = 0
        self._checked = 0
        self._seen_at_check = 0
        self._seeded = False
        self._edits: list[FileEdit] = []
        self._ring_size = 0
        self._watch: BoardWatch | None = None
        self._task: asyncio.Task[None] | None = None
        self._rebuild_due = False
        self._stale: str | None = None if book is None else "the keys bucket is not read yet"
        self._warned: set[str] = set()
        self.rebuilds = 0
        """Rings built from the bucket so far."""

    def stale(self) -> str | None:
        """Why the ring may not be the bucket's (None: it is, or there is no bucket)."""
        return self._stale

    async def start(self) -> None:
        """Read the bucket (bounded: else start on the bootstrap's keys) and keep watching."""
        if self._book is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_START_BOUND_S):
                await self._check()
        self._task = asyncio.create_task(self._keep_checking(), name="keys bucket watch")

    async def stop(self) -> None:
        """Stop watching."""
        if self._task is not None:
            await cancel_task(self._task)
            self._task = None
        await self._unwatch()

    def reboot(self, boot: Bootstrap) -> None:
        """A new bootstrap (the keys file read again): the ring now; at the next check the new
        names are seeded, and each entry the file changed or removed is changed or deleted in
        the bucket, if the bucket still holds what the file held before."""
        self._edits.extend(file_edits(self._boot.seeds, boot.seeds))
        self._boot = boot
        self._seeded = False
        self._rebuild()

    # -- the watch --------------------------------------------------------------------------

    async def _keep_checking(self) -> None:
        while True:
            await asyncio.sleep(self._check_s)
            try:
                await self._check()
            except Exception as exc:  # a bug's: ended, a revoked key would stay accepted
                log.exception("gateway keys: the check failed (tried again at the next)")
                self._went_stale(f"the check failed ({type(exc).__name__})")
                await self._unwatch()  # the next check watches again, as after a broker error

    async def _check(self) -> None:
        """One check: the bucket's last revision against the watch's (see the module)."""
        assert self._book is not None
        try:
            last = await self._book.last_revision()
            if self._watch is None or last < self._seen or self._stuck():
                await self._rewatch(last)
            self._checked, self._seen_at_check = last, self._seen
        except BrokerError as exc:
            self._went_stale(f"the keys bucket did not answer ({type(exc).__name__})", exc)
            await self._unwatch()
            return
        await self._write_file_entries()

    async def _write_file_entries(self) -> None:
        """The keys file's seeds and edits, tried again at the next check when the bucket
        refuses them (logged once per reason; the ring is not stale for it)."""
        try:
            if not self._seeded:
                await self._seed()
            await self._apply_edits()
        except BrokerError as exc:
            why = f"the keys file's entries could not be written to the keys bucket: {exc}"
            if why not in self._warned:
                self._warned.add(why)
                log.warning("gateway keys: %s (tried again every check)", why)

    def _stuck(self) -> bool:
        """Whether the watch has not reached what the previous check saw, and made no
        progress since."""
        return self._seen < self._checked and self._seen == self._seen_at_check

    async def _rewatch(self, last: int) -> None:
        assert self._book is not None
        await self._unwatch()
        self._pending, self._target, self._seen = {}, last, 0
        self._watch = await self._book.watch(self._on_entry)
        if self._pending is not None and last == 0:
            self._switch()

    async def _unwatch(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            with contextlib.suppress(BrokerError):
                await watch.stop()

    def _on_entry(self, entry: KeyEntry) -> None:
        self._seen = max(self._seen, entry.revision)
        if self._pending is not None:
            self._pending[entry.kind, entry.name] = entry
            if self._seen >= self._target:
                self._switch()
            return
        self._entries[entry.kind, entry.name] = entry
        if not self._rebuild_due:
            self._rebuild_due = True
            asyncio.get_running_loop().call_soon(self._rebuild)

    def _switch(self) -> None:
        """The fresh watch caught up: its entries are the bucket's."""
        assert self._pending is not None
        self._entries, self._pending = self._pending, None
        if self._stale is not None:
            log.info("gateway keys: the keys bucket is read (%d entries)", len(self._entries))
        self._stale = None
        self._rebuild()

    def _went_stale(self, why: str, exc: Exception | None = None) -> None:
        """Stale for ``why``: what the unauthenticated ``/readyz`` tells, so the error's kind
        and never its text (a broker's address, a key's name); the log has ``exc`` whole."""
        if self._stale != why:
            said = f"{why}: {exc}" if exc is not None else why
            log.warning("gateway keys: %s; the %d keys in force stay", said, self._ring_size)
        self._stale = why

    # -- the ring ---------------------------------------------------------------------------

    def _rebuild(self) -> None:
        self._rebuild_due = False
        ring, problems = merged_ring(self._boot, self._entries, keyed=self._keyed)
        for problem in problems:
            if problem not in self._warned:
                self._warned.add(problem)
                log.warning("gateway keys: %s", problem)
        try:
            self._apply(ring)
        except ConfigError as exc:
            log.error("gateway keys not changed (the %d in force stay): %s", self._ring_size, exc)
            return
        self._keyed = bool(ring)
        self._ring_size = len(ring)
        self.rebuilds += 1

    async def _seed(self) -> None:
        """Write each seed whose name the bucket never held (revision 0)."""
        assert self._book is not None
        for record in self._boot.seeds:
            kind = _kind(record)
            if (kind, record.name) in self._entries:
                continue
            if await self._book.write(kind, record.name, record, expected=0) is not None:
                log.info("gateway keys: %s %s seeded from the keys file", kind, record.name)
        self._seeded = True

    async def _apply_edits(self) -> None:
        """The keys file's edits since the last load, where the bucket holds the old record."""
        assert self._book is not None
        while self._edits:
            edit = self._edits[0]
            entry = await self._book.entry(edit.kind, edit.name)
            if entry is not None and entry.record == edit.old:
                await self._book.write(edit.kind, edit.name, edit.new, expected=entry.revision)
                what = "revoked" if edit.new is None else "changed"
                log.info("gateway keys: %s %s %s by the keys file", edit.kind, edit.name, what)
            self._edits.pop(0)


@dataclass(frozen=True)
class FileEdit:
    """An entry the keys file changed (``new``) or removed (``new`` None) on a reload."""

    kind: EntryKind
    name: str
    old: KeyRecord | TenantRecord
    new: KeyRecord | TenantRecord | None


def file_edits(
    old: Sequence[KeyRecord | TenantRecord], new: Sequence[KeyRecord | TenantRecord]
) -> list[FileEdit]:
    """What a reload of the keys file changed and removed, entry by entry."""
    now = {(_kind(r), r.name): r for r in new}
    edits = []
    for record in old:
        kind = _kind(record)
        after = now.get((kind, record.name))
        if after != record:
            edits.append(FileEdit(kind, record.name, record, after))
    return edits


def _kind(record: KeyRecord | TenantRecord) -> EntryKind:
    return "key" if isinstance(record, KeyRecord) else "tenant"
