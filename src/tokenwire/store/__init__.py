"""The durable store of session events: a projection of the broker's chunk stream.

For each (session, turn, step) the store keeps, in one transaction, the step's chunk log
(packed: one row per step) and its assembled :class:`~tokenwire.schemas.Message` or
:class:`~tokenwire.schemas.RecordedError`, with a per-session contiguous sequence: chunk i of
a session has seq i (from 1), and every outcome cites the range of its step's chunks.

Three implementations of one :class:`Store` Protocol: :class:`SQLiteStore` (the embedded
default), :class:`PostgresStore`, and :class:`MemoryStore` for unit tests of other pieces.
:func:`open_store` picks one from a URL. See docs/store.md.

Example::

    store = open_store("sqlite:///./.tokenwire/store.db")
    [done] = await store.commit([record])       # CommittedStep(seq_start=1, seq_end=12, ...)
    events = await store.session_events(record.session)
    await store.close()

Errors::

    StoreError
    ├── StoreConfigError
    ├── StoreUnavailable
    └── StoreIntegrityError
"""

import typing as _typing

from tokenwire.store._errors import (
    StoreConfigError,
    StoreError,
    StoreIntegrityError,
    StoreUnavailable,
)
from tokenwire.store._memory import MemoryStore
from tokenwire.store._open import open_store, redact
from tokenwire.store._packing import pack_chunks, unpack_chunks
from tokenwire.store._protocol import Store
from tokenwire.store._records import (
    CommittedStep,
    OutcomeKind,
    SessionSummary,
    StepRecord,
    StepRepair,
    StoreStats,
)
from tokenwire.store._sqlite import SQLiteStore

if _typing.TYPE_CHECKING:
    from tokenwire.store._postgres import PostgresStore


def __getattr__(name: str) -> object:
    """``PostgresStore`` is imported on first use: psycopg is the ``postgres`` extra."""
    if name == "PostgresStore":
        from tokenwire.store._postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CommittedStep",
    "MemoryStore",
    "OutcomeKind",
    "PostgresStore",
    "SQLiteStore",
    "SessionSummary",
    "StepRecord",
    "StepRepair",
    "Store",
    "StoreConfigError",
    "StoreError",
    "StoreIntegrityError",
    "StoreStats",
    "StoreUnavailable",
    "open_store",
    "pack_chunks",
    "redact",
    "unpack_chunks",
]
