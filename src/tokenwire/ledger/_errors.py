"""The ledger's exception tree.

```
LedgerError
└── InvalidUsageQuery   a grouping or a ``since`` the ledger cannot answer (the caller's fault)
```
"""

from __future__ import annotations


class LedgerError(Exception):
    """Base of every error the ledger raises."""


class InvalidUsageQuery(LedgerError):  # noqa: N818  # a query, like httpx's InvalidURL
    """A usage query names an unknown grouping or an unreadable ``since``.

    ``field`` is the parameter (``by``, ``since``), ``value`` what was given (cut to 80
    characters) and ``reason`` what would have been accepted.
    """

    def __init__(self, field: str, value: str, reason: str) -> None:
        super().__init__(f"{field} {value[:80]!r}: {reason}")
        self.field = field
        self.value = value[:80]
        self.reason = reason
