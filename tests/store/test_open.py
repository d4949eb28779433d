"""open_store: which URLs name which store, and clear errors for the rest."""

from __future__ import annotations

from pathlib import Path

import pytest

import tokenwire.store
from tokenwire.store import (
    MemoryStore,
    PostgresStore,
    SQLiteStore,
    StoreConfigError,
    StoreError,
    StoreIntegrityError,
    StoreUnavailable,
    open_store,
    redact,
)


@pytest.mark.parametrize(
    ("url", "path"),
    [
        ("sqlite:///store.db", Path("store.db")),
        ("sqlite:///./.tokenwire/store.db", Path(".tokenwire/store.db")),
        ("sqlite:////var/lib/tw/store.db", Path("/var/lib/tw/store.db")),
        ("SQLITE:///a%20b.db", Path("a b.db")),
    ],
)
def test_sqlite_urls(url: str, path: Path) -> None:
    store = open_store(url)
    assert isinstance(store, SQLiteStore)
    assert store.path == path
    assert store.url == url


def test_postgres_and_memory_urls() -> None:
    for url in ("postgresql://u@h:5433/db", "postgres://h/db?sslmode=disable"):
        assert isinstance(open_store(url), PostgresStore)
    store = open_store("postgresql://u:s3cret@h/db")
    assert store.url == "postgresql://h/db"  # tokenwire.scrub: URLs lose their userinfo
    assert isinstance(open_store("memory://"), MemoryStore)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("", "unknown kind of store"),
        ("store.db", "unknown kind of store"),
        ("mysql://u@h/db", "unknown kind of store"),
        ("sqlite:/store.db", "unknown kind of store"),
        ("sqlite://store.db", "three slashes"),
        ("sqlite:///", "no database file"),
        ("sqlite:///data/", "no database file"),
        ("sqlite:///x.db?synchronous=OFF", "NORMAL or FULL"),
        ("sqlite:///x.db?journal=delete", "unknown option"),
        ("postgresql://u@h/db?bogus=1", "not a valid PostgreSQL URL"),
        ("postgresql://[::1/db", "not a valid PostgreSQL URL"),
    ],
)
def test_bad_urls_are_config_errors(url: str, says: str) -> None:
    with pytest.raises(StoreConfigError, match=says) as info:
        open_store(url)
    assert info.value.reason
    assert "sqlite:///PATH" in str(info.value) or says != "unknown kind of store"


def test_config_errors_never_show_the_password() -> None:
    for url in ("postgresql://u:s3cret@h/db?bogus=1", "postgresql://u:s3cret@[::1/db"):
        with pytest.raises(StoreConfigError) as info:
            open_store(url)
        assert "s3cret" not in str(info.value)
        assert "s3cret" not in info.value.url


def test_redact() -> None:
    assert redact("postgres://a:b@h/d") == "postgres://h/d"
    assert redact("postgres://a@h/d") == "postgres://h/d"
    assert redact("sqlite:///x.db") == "sqlite:///x.db"


def test_error_tree() -> None:
    for leaf in (StoreConfigError, StoreUnavailable, StoreIntegrityError):
        assert issubclass(leaf, StoreError)
    error = StoreUnavailable("postgresql", "gone", "57P01")
    assert (error.backend, error.reason, error.sqlstate) == ("postgresql", "gone", "57P01")
    assert str(error) == "postgresql store unavailable [57P01]: gone"


def test_public_names_are_exactly_all() -> None:
    public = {n for n in vars(tokenwire.store) if not n.startswith("_")}
    modules = {n for n in public if type(getattr(tokenwire.store, n)).__name__ == "module"}
    lazy = {"PostgresStore"}  # imported on first use: psycopg is the postgres extra
    assert set(tokenwire.store.__all__) == (public - modules - {"annotations"}) | lazy
    assert all(getattr(tokenwire.store, name) for name in lazy)
