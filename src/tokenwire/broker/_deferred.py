"""aiohttp deferred until used, so that importing nats-py does not load it.

nats-py imports aiohttp, when it is installed, for its optional WebSocket transport
(``ws://`` servers); tokenwire's processes connect over TCP unless told otherwise, and loading
aiohttp and its dependencies was about a third of a gateway's imports in an environment that
has it (the development one does, for the benchmark's bare proxy). Before nats-py is imported,
``sys.modules`` gets a stand-in module that imports the real aiohttp on its first attribute
use: a ``ws://`` connection, or any other code that uses aiohttp, loads it then
(docs/adr/0038).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any


class _Deferred(types.ModuleType):
    """Stands in for a module until an attribute of it is used; then imports it."""

    def __getattr__(self, attribute: str) -> Any:
        name = self.__name__
        if sys.modules.get(name) is self:
            del sys.modules[name]
        return getattr(importlib.import_module(name), attribute)


def defer(name: str) -> None:
    """Put a stand-in for ``name`` in ``sys.modules``, unless it is imported already or is
    not installed."""
    if name not in sys.modules and importlib.util.find_spec(name) is not None:
        sys.modules[name] = _Deferred(name)


defer("aiohttp")
