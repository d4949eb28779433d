"""The keys bucket's contract (``broker.KeyBook``, ADR 0041), over the real bucket on the
real server and the in-memory twin: writes are compare-and-set on an entry's revision (0:
never written), a delete stays as a marker that a create-on-0 cannot pass, and a watch tells
every entry now, then each change. Waits are on conditions, bounded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from nats.aio.client import Client

from tokenwire.broker import (
    KeyBook,
    KeyEntry,
    KeysBucket,
    MemoryKeys,
    Restorer,
    Topology,
    stream_info,
)
from tokenwire.broker._keys import entry_of
from tokenwire.schemas import KeyRecord, Limits, TenantRecord

DIGEST = "ab" * 32


def key(name: str, rpm: int | None = None) -> KeyRecord:
    return KeyRecord(name=name, sha256=DIGEST, tenant="team", limits=Limits(rpm=rpm))


@pytest.fixture(params=["real", "memory"])
async def book(
    request: pytest.FixtureRequest, nc: Client, topology: Topology
) -> AsyncIterator[KeyBook]:
    if request.param == "memory":
        yield MemoryKeys()
        return
    yield KeysBucket(nc, topology.keys_bucket)


class Seen:
    """What a watch delivered, and a bounded wait for a condition on it."""

    def __init__(self) -> None:
        self.entries: list[KeyEntry] = []
        self.changed = asyncio.Event()

    def __call__(self, entry: KeyEntry) -> None:
        self.entries.append(entry)
        self.changed.set()

    async def until(self, test: Callable[[KeyEntry], bool], timeout_s: float = 10) -> KeyEntry:
        async with asyncio.timeout(timeout_s):
            while True:
                for entry in self.entries:
                    if test(entry):
                        return entry
                self.changed.clear()
                await self.changed.wait()


async def test_writes_are_compare_and_set_and_a_delete_stays(book: KeyBook) -> None:
    assert await book.entry("key", "a") is None
    first = await book.write("key", "a", key("a"), expected=0)
    assert first is not None
    assert await book.write("key", "a", key("a", 5), expected=0) is None  # not a create
    second = await book.write("key", "a", key("a", 60), expected=first)
    assert second is not None
    assert second > first
    held = await book.entry("key", "a")
    assert held is not None
    assert held.record == key("a", 60)
    assert held.revision == second
    deleted = await book.write("key", "a", None, expected=second)
    assert deleted is not None
    gone = await book.entry("key", "a")
    assert gone is not None
    assert gone.record is None
    assert gone.revision == deleted
    # a revoked name is never created again on revision 0 (a keys file's seed)
    assert await book.write("key", "a", key("a"), expected=0) is None
    assert await book.last_revision() == deleted


async def test_entries_list_keys_and_tenants_deleted_ones_too(book: KeyBook) -> None:
    await book.write("key", "b", key("b"), expected=0)
    await book.write("tenant", "team", TenantRecord(name="team", limits=Limits(rpm=9)), expected=0)
    revision = await book.write("key", "c", key("c"), expected=0)
    await book.write("key", "c", None, expected=revision)
    entries = await book.entries()
    assert [(e.kind, e.name, e.record is None) for e in entries] == [
        ("key", "b", False),
        ("key", "c", True),
        ("tenant", "team", False),
    ]


async def test_a_watch_tells_every_entry_then_each_change(book: KeyBook) -> None:
    await book.write("key", "d", key("d"), expected=0)
    seen = Seen()
    watch = await book.watch(seen)
    try:
        await seen.until(lambda e: e.name == "d" and e.record == key("d"))
        held = await book.entry("key", "d")
        assert held is not None
        await book.write("key", "d", None, expected=held.revision)
        await seen.until(lambda e: e.name == "d" and e.record is None)
        await book.write("tenant", "t2", TenantRecord(name="t2"), expected=0)
        await seen.until(lambda e: e.kind == "tenant" and e.name == "t2")
    finally:
        await watch.stop()


def test_an_unreadable_or_misnamed_entry_is_refused_not_guessed() -> None:
    bad = entry_of("key", "x", 3, None, b'{"name": "x"}')
    assert bad.record is None
    assert bad.invalid
    other = entry_of("key", "x", 4, None, b'{"name": "y", "sha256": "' + DIGEST.encode() + b'"}')
    assert other.record is None
    assert "y" in other.invalid
    deleted = entry_of("key", "x", 5, {"KV-Operation": "DEL"}, b"")
    assert deleted.record is None
    assert not deleted.invalid


async def test_provisioned_file_backed_replicated_and_restored(
    nc: Client, topology: Topology
) -> None:
    info = await stream_info(nc, f"KV_{topology.keys_bucket}")
    assert info["config"]["storage"] == "file"
    assert info["config"]["num_replicas"] == topology.replicas
    assert info["config"]["max_msgs_per_subject"] == 1
    js = nc.jetstream()
    await js.delete_stream(f"KV_{topology.keys_bucket}")
    bucket = KeysBucket(nc, topology.keys_bucket)
    assert not await bucket.ensure()
    restorer = Restorer(nc, topology)
    assert await restorer.keys_bucket() == "restored"
    assert await bucket.ensure()
    assert await restorer.keys_bucket() == "later"


async def test_a_foreign_subject_is_told_as_invalid_so_a_watcher_counts_it(
    nc: Client, topology: Topology
) -> None:
    bucket = KeysBucket(nc, topology.keys_bucket)
    await nc.jetstream().publish(f"$KV.{topology.keys_bucket}.stray", b"x")
    seen = Seen()
    watch = await bucket.watch(seen)
    try:
        stray = await seen.until(lambda e: bool(e.invalid))
    finally:
        await watch.stop()
    assert stray.name == ""
    assert stray.record is None
    assert stray.revision == await bucket.last_revision()
    assert await bucket.entries() == []
