"""Bounded label values: an unknown or malformed model name (or error code) never mints a
series.

A model name becomes a label value only once a call to it started streaming (the provider
accepted it) and only while fewer than ``limit`` names have been admitted; anything else is
``other``. Error types are admitted the same way, up to their own limit, else ``_OTHER``.
"""

from __future__ import annotations

import re

OTHER = "other"
_WELL_FORMED = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+-]{0,95}")


class BoundedLabels:
    """At most ``limit`` distinct well-formed values; the rest map to ``fallback``."""

    def __init__(self, limit: int, fallback: str) -> None:
        self.limit = limit
        self.fallback = fallback
        self._admitted: set[str] = set()

    def admit(self, value: str) -> str:
        """``value`` as a label: admitted now if well formed and there is room."""
        if value in self._admitted:
            return value
        if len(self._admitted) >= self.limit or not _WELL_FORMED.fullmatch(value):
            return self.fallback
        self._admitted.add(value)
        return value

    def known(self, value: str) -> str:
        """``value`` as a label if already admitted, else the fallback (never admits)."""
        return value if value in self._admitted else self.fallback


def model_labels(limit: int = 100) -> BoundedLabels:
    """Model label values: admitted on a call that started streaming (see the module doc)."""
    return BoundedLabels(limit, OTHER)


def error_type_labels(limit: int = 64) -> BoundedLabels:
    """``error.type`` values: HTTP statuses, provider error codes, tokenwire's own kinds."""
    return BoundedLabels(limit, "_OTHER")
