"""SQLite only: the file, its mode, and a writer locked out for longer than busy_timeout."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tokenwire.store import SQLiteStore, StoreConfigError, StoreUnavailable, open_store

from .builders import message_record


async def test_relative_path_creates_folder_and_wal_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = open_store("sqlite:///./data/deep/store.db")
    assert not (tmp_path / "data").exists()  # nothing touches the disk before the first call
    try:
        await store.commit([message_record("s", 0, 0, 2)])
    finally:
        await store.close()
    db = tmp_path / "data" / "deep" / "store.db"
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("SELECT seq_start, seq_end FROM steps").fetchall() == [(1, 2)]
    conn.close()


async def test_a_writer_locked_out_is_unavailable_then_recovers(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    store = SQLiteStore(path, busy_timeout_s=0.05)
    await store.ping()  # created and migrated
    other = sqlite3.connect(path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        with pytest.raises(StoreUnavailable) as info:
            await store.commit([message_record("s", 0, 0, 1)])
        assert info.value.backend == "sqlite"
        assert "locked" in info.value.reason
        other.execute("ROLLBACK")
        [done] = await store.commit([message_record("s", 0, 0, 1)])
        assert (done.seq_start, done.seq_end, done.inserted) == (1, 1, True)
    finally:
        other.close()
        await store.close()


async def test_a_file_that_is_not_a_database_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(b"this is not a sqlite database, just text " * 200)
    store = open_store(f"sqlite:///{path}")
    try:
        with pytest.raises(StoreConfigError, match="not a database"):
            await store.ping()
    finally:
        await store.close()


async def test_synchronous_option_reaches_the_store(tmp_path: Path) -> None:
    normal = open_store(f"sqlite:///{tmp_path}/a.db?synchronous=normal")
    full = open_store(f"sqlite:///{tmp_path}/b.db")
    assert isinstance(normal, SQLiteStore)
    assert isinstance(full, SQLiteStore)
    assert (normal.synchronous, full.synchronous) == ("NORMAL", "FULL")
    assert normal.path == tmp_path / "a.db"
    await normal.close()
    await full.close()
