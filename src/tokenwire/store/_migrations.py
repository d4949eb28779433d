"""Numbered SQL migrations per backend: ``migrations/<backend>/NNNN_name.sql``.

Each backend applies the missing ones at open, inside one transaction that first takes the
migration lock (PostgreSQL: a transaction-scoped advisory lock; SQLite: ``BEGIN IMMEDIATE``),
so two processes starting at once apply each migration exactly once. The applied versions are
rows of ``schema_migrations``. A database newer than this code is refused.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Literal

import msgspec

from tokenwire.store._errors import StoreConfigError

Backend = Literal["sqlite", "postgres"]

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

CREATE_MIGRATIONS_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_ns BIGINT NOT NULL)"
)


class Migration(msgspec.Struct, frozen=True):
    """One numbered migration: its statements run in order in the migration transaction."""

    version: int
    name: str
    statements: tuple[str, ...]


def load_migrations(backend: Backend) -> tuple[Migration, ...]:
    """The backend's migrations in version order (versions 1, 2, ... without gaps)."""
    folder = resources.files("tokenwire.store").joinpath("migrations", backend)
    found = []
    for entry in folder.iterdir():
        if (match := _NAME.match(entry.name)) is not None:
            text = entry.read_text(encoding="utf-8")
            found.append(Migration(int(match[1]), match[2], split_statements(text)))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(f"{backend} migrations are not numbered 1..n without gaps")
    return tuple(found)


def split_statements(sql: str) -> tuple[str, ...]:
    """Split a migration file into statements: ``--`` comment lines dropped, split on ``;``
    at a line end. (Our migrations have no procedural bodies with inner semicolons.)"""
    lines = [line for line in sql.splitlines() if not line.lstrip().startswith("--")]
    parts = re.split(r";\s*$", "\n".join(lines), flags=re.MULTILINE)
    return tuple(part.strip() for part in parts if part.strip())


def pending(applied: set[int], migrations: tuple[Migration, ...], url: str) -> list[Migration]:
    """The migrations not yet applied; a database with an unknown version is refused."""
    newest = migrations[-1].version if migrations else 0
    if unknown := sorted(v for v in applied if v > newest):
        raise StoreConfigError(
            url,
            f"database schema version {unknown[-1]} is newer than this tokenwire "
            f"(knows up to {newest}); upgrade tokenwire",
        )
    return [m for m in migrations if m.version not in applied]
