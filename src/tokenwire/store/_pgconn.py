"""One lazily opened PostgreSQL connection, its lock, its time bound and error translation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import psycopg.errors

from tokenwire.store._errors import StoreError, StoreIntegrityError, StoreUnavailable

PgConnection = psycopg.AsyncConnection[tuple[Any, ...]]


def translate(exc: psycopg.Error) -> StoreError:
    """A psycopg error as a store error.

    Constraint and data errors are :class:`StoreIntegrityError`; everything else (connection
    loss, shutdown, deadlock, serialization failure, and also a dropped table) is
    :class:`StoreUnavailable`: the caller cannot make progress now and retries with backoff,
    which is also right while an operator repairs the database.
    """
    reason = (str(exc).strip() or type(exc).__name__).splitlines()[0]
    if isinstance(exc, psycopg.errors.IntegrityError | psycopg.errors.DataError):
        return StoreIntegrityError(reason)
    return StoreUnavailable("postgresql", reason, exc.sqlstate)


class PgLink:
    """One connection used by one task at a time (a transaction never interleaves another
    task's statements), opened on first use and dropped after any failure that is not about
    the data, so the next use reconnects. Every use is bounded by ``timeout_s``."""

    def __init__(self, conninfo: str, *, connect_timeout_s: float, timeout_s: float) -> None:
        self._conninfo = conninfo
        self._connect_timeout_s = connect_timeout_s
        self._timeout_s = timeout_s
        self._lock = asyncio.Lock()
        self._conn: PgConnection | None = None

    @asynccontextmanager
    async def use(self) -> AsyncIterator[PgConnection]:
        """The connection, exclusively, for the block. Raises StoreError only."""
        async with self._lock:
            try:
                async with asyncio.timeout(self._timeout_s):
                    yield await self._open()
            except StoreIntegrityError:
                raise
            except psycopg.Error as exc:
                error = translate(exc)
                if not isinstance(error, StoreIntegrityError):
                    await self.discard()
                raise error from exc
            except TimeoutError as exc:
                await self.discard()
                raise StoreUnavailable("postgresql", f"no answer in {self._timeout_s} s") from exc
            except BaseException:
                # Cancelled mid-statement or failed oddly: the protocol state is unknown.
                await self.discard()
                raise

    async def discard(self) -> None:
        """Close and forget the connection (the next use opens a new one)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()

    async def _open(self) -> PgConnection:
        if self._conn is None or self._conn.closed:
            self._conn = await psycopg.AsyncConnection.connect(
                self._conninfo,
                autocommit=True,
                connect_timeout=max(1, round(self._connect_timeout_s)),
            )
        return self._conn
