"""``open_store(url)``: the one place a store URL is read."""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable
from typing import TYPE_CHECKING, get_args

from tokenwire.scrub import scrub
from tokenwire.store._errors import StoreConfigError
from tokenwire.store._memory import MemoryStore
from tokenwire.store._protocol import Store
from tokenwire.store._sqlite import SQLiteStore, Synchronous

if TYPE_CHECKING:
    from tokenwire.store._postgres import PostgresStore

_FORMS = "sqlite:///PATH, postgresql://..., postgres://... or memory://"


def open_store(url: str, *, clock: Callable[[], int] = time.time_ns) -> Store:
    """The store a URL names, not yet connected (the first call connects and migrates).

    - ``sqlite:///PATH``: a file, relative to the working directory (``sqlite:///./x.db``) or
      absolute (``sqlite:////var/lib/x.db``); ``?synchronous=NORMAL`` trades power-loss
      durability for speed (default ``FULL``).
    - ``postgresql://...`` or ``postgres://...``: a libpq URL; tables go to the first schema
      of ``search_path`` (``?options=-csearch_path%3Dmyschema`` picks one).
    - ``memory://``: in this process only (tests).

    Anything else raises :class:`StoreConfigError` naming the accepted forms.
    """
    scheme, sep, rest = url.partition("://")
    match scheme.lower() if sep else "":
        case "sqlite":
            return _sqlite(url, rest, clock)
        case "postgresql" | "postgres":
            return _postgres(url, clock)
        case "memory":
            return MemoryStore(clock=clock)
        case _:
            raise StoreConfigError(redact(url), f"unknown kind of store; use {_FORMS}")


def redact(text: str) -> str:
    """``text`` (a URL, or an error message quoting one) without credentials
    (:func:`tokenwire.scrub.scrub`: ``postgresql://u:secret@h/db`` -> ``postgresql://h/db``)."""
    return scrub(text)


def _sqlite(url: str, rest: str, clock: Callable[[], int]) -> SQLiteStore:
    location, _, query = rest.partition("?")
    if not location.startswith("/"):
        raise StoreConfigError(url, "a SQLite URL has three slashes: sqlite:///PATH")
    path = urllib.parse.unquote(location[1:])
    if not path or path.endswith("/"):
        raise StoreConfigError(url, "no database file named after sqlite:///")
    options = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
    synchronous = options.pop("synchronous", "FULL").upper()
    if options:
        raise StoreConfigError(url, f"unknown option(s) {sorted(options)}; known: synchronous")
    if synchronous not in get_args(Synchronous):
        raise StoreConfigError(url, "synchronous must be NORMAL or FULL")
    mode: Synchronous = "NORMAL" if synchronous == "NORMAL" else "FULL"
    return SQLiteStore(path, synchronous=mode, clock=clock, url=url)


def _postgres(url: str, clock: Callable[[], int]) -> PostgresStore:
    # psycopg is the optional ``tokenwire[postgres]`` extra: imported only for such a URL.
    try:
        import psycopg.conninfo

        from tokenwire.store._postgres import PostgresStore
    except ImportError as exc:
        raise StoreConfigError(
            redact(url), f"PostgreSQL needs psycopg: pip install 'tokenwire[postgres]' ({exc})"
        ) from exc
    try:
        psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error as exc:
        reason = redact(str(exc).strip().splitlines()[0])
        raise StoreConfigError(redact(url), f"not a valid PostgreSQL URL: {reason}") from exc
    return PostgresStore(url, url=redact(url), clock=clock)
