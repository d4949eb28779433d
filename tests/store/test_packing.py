"""Packing and migrations files: units with their own oracles."""

from __future__ import annotations

import json
import zlib

import pytest

from tokenwire.store import StoreIntegrityError, pack_chunks, unpack_chunks
from tokenwire.store._migrations import Backend, load_migrations, split_statements

from .builders import full_step_chunks, text_chunks


def test_blob_is_zlib_of_the_wire_json_array() -> None:
    chunks = full_step_chunks("s")
    decoded = json.loads(zlib.decompress(pack_chunks(chunks)))
    assert [d["ordinal"] for d in decoded] == [0, 1, 2, 3, 4]
    assert decoded[1]["chunk"] == {"type": "text-delta", "index": 0, "text": "héllo \u0000 wörld"}
    assert decoded[0]["request_time_ns"] == chunks[0].time_ns - 250_000_000
    assert unpack_chunks(pack_chunks(chunks)) == chunks
    assert unpack_chunks(pack_chunks([])) == []


def test_packing_compresses_a_long_step() -> None:
    chunks = text_chunks("session-0123456789", 0, 0, 300)
    raw = sum(len(json.dumps(json.loads(zlib.decompress(pack_chunks([c]))))) for c in chunks)
    assert len(pack_chunks(chunks)) * 5 < raw


@pytest.mark.parametrize(
    ("blob", "packing"), [(b"junk", 1), (zlib.compress(b'[{"x": 1}]'), 1), (b"", 2)]
)
def test_damaged_blobs_are_integrity_errors(blob: bytes, packing: int) -> None:
    with pytest.raises(StoreIntegrityError):
        unpack_chunks(blob, packing)


def test_split_statements() -> None:
    sql = "-- comment; not a statement\nCREATE TABLE a (x INT);\n\nCREATE INDEX i ON a (x);\n"
    assert split_statements(sql) == ("CREATE TABLE a (x INT)", "CREATE INDEX i ON a (x)")


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_migrations_are_numbered_and_define_the_tables(backend: Backend) -> None:
    migrations = load_migrations(backend)
    assert [(m.version, m.name) for m in migrations] == [
        (1, "initial"),
        (2, "session_tenant"),
        (3, "usage_ledger"),
        (4, "step_repairs"),
        (5, "routed_steps"),
    ]
    text = " ".join(migrations[0].statements)
    for table in ("CREATE TABLE sessions", "CREATE TABLE steps"):
        assert table in text
    ledger = " ".join(migrations[2].statements)
    for table in ("CREATE TABLE step_usage", "CREATE TABLE usage_daily"):
        assert table in ledger
