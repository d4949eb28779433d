"""The store's exception tree.

```
StoreError
├── StoreConfigError      the URL or the database is not usable as configured (permanent)
├── StoreUnavailable      the database cannot be reached or failed transiently (retry later)
└── StoreIntegrityError   a record or a row breaks the store's rules (permanent for that input)
```

Driver errors (``sqlite3``, ``psycopg``) are translated at the boundary and kept as
``__cause__``. An assembler backs off and retries on :class:`StoreUnavailable`; a commit whose
outcome is unknown (the connection died during ``COMMIT``) is safe to repeat, because
:meth:`Store.commit` is idempotent.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base of every error the store raises."""


class StoreConfigError(StoreError):
    """The store URL (or the file or database it names) cannot be used as configured.

    ``url`` is the URL with any password replaced by ``***``.
    """

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"bad store URL {url!r}: {reason}")
        self.url = url
        self.reason = reason


class StoreUnavailable(StoreError):  # noqa: N818  # the name the brief and callers use
    """The database is unreachable, down, locked for too long or failed transiently.

    ``backend`` is ``"sqlite"`` or ``"postgresql"``; ``sqlstate`` is PostgreSQL's error code
    when the server sent one. The store drops the failed connection and reconnects on the
    next call, so the same store object recovers once the database is back.
    """

    def __init__(self, backend: str, reason: str, sqlstate: str | None = None) -> None:
        code = f" [{sqlstate}]" if sqlstate else ""
        super().__init__(f"{backend} store unavailable{code}: {reason}")
        self.backend = backend
        self.reason = reason
        self.sqlstate = sqlstate


class StoreIntegrityError(StoreError):
    """A record is malformed (chunks of another step, ordinals out of order) or a row
    conflicts with the store's unique keys. Retrying the same input fails the same way.

    ``session``, ``turn`` and ``step`` name the offending step when it is known.
    """

    def __init__(
        self,
        reason: str,
        session: str | None = None,
        turn: int | None = None,
        step: int | None = None,
    ) -> None:
        where = f" ({session}/{turn}/{step})" if session is not None else ""
        super().__init__(f"store integrity error{where}: {reason}")
        self.reason = reason
        self.session = session
        self.turn = turn
        self.step = step
