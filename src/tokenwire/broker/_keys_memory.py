"""The keys bucket's in-memory twin (:class:`MemoryKeys`), for unit tests of the gateway and
the CLI alone; it passes the same contract suite as ``KeysBucket`` (tests/broker/test_keys.py)
and never replaces the broker in a test that claims the system works.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tokenwire.broker._errors import BrokerUnavailable
from tokenwire.broker._keys import EntryKind, KeyEntry
from tokenwire.schemas import KeyRecord, TenantRecord


@dataclass
class MemoryKeys:
    """The entries in a dict, one book for every gateway of a test that shares it. Watchers
    are called synchronously, in the order entries are stored; ``down`` makes every call
    raise ``BrokerUnavailable`` (a broker away)."""

    down: bool = False
    _entries: dict[tuple[EntryKind, str], KeyEntry] = field(default_factory=dict)
    _revision: int = 0
    _watchers: list[Callable[[KeyEntry], None]] = field(default_factory=list)

    def _check(self) -> None:
        if self.down:
            raise BrokerUnavailable("memory://keys")

    async def entry(self, kind: EntryKind, name: str) -> KeyEntry | None:
        """The stored entry, None when never written."""
        self._check()
        return self._entries.get((kind, name))

    async def entries(self) -> list[KeyEntry]:
        """Every entry, by kind and name."""
        self._check()
        return [self._entries[k] for k in sorted(self._entries)]

    async def write(
        self,
        kind: EntryKind,
        name: str,
        record: KeyRecord | TenantRecord | None,
        *,
        expected: int | None,
    ) -> int | None:
        """Store (None: delete) when the entry's revision is ``expected``."""
        self._check()
        held = self._entries.get((kind, name))
        if expected is not None and (0 if held is None else held.revision) != expected:
            return None
        self._revision += 1
        entry = KeyEntry(kind, name, self._revision, record)
        self._entries[kind, name] = entry
        for watcher in list(self._watchers):
            watcher(entry)
        return self._revision

    async def watch(self, on_entry: Callable[[KeyEntry], None]) -> MemoryKeysWatch:
        """Every entry now (in the order stored, as the broker delivers them), then each
        change."""
        self._check()
        for entry in sorted(self._entries.values(), key=lambda e: e.revision):
            on_entry(entry)
        self._watchers.append(on_entry)
        return MemoryKeysWatch(self._watchers, on_entry)

    async def last_revision(self) -> int:
        """The last revision stored."""
        self._check()
        return self._revision

    async def ensure(self) -> bool:
        """There unless ``down``."""
        return not self.down


@dataclass
class MemoryKeysWatch:
    """A watch of :class:`MemoryKeys`."""

    watchers: list[Callable[[KeyEntry], None]]
    on_entry: Callable[[KeyEntry], None]

    async def stop(self) -> None:
        """No more calls."""
        if self.on_entry in self.watchers:
            self.watchers.remove(self.on_entry)
