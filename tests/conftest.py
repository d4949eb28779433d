"""Root fixtures: each fixture module is one chain of real parts (see PRINCIPLES.md, 8)."""

import tokenwire.broker  # noqa: F401  (before nats-py: aiohttp then stays unloaded, ADR 0038)

pytest_plugins = [
    "tests.fixtures.recordings",
    "tests.fixtures.broker",
    "tests.fixtures.stores",
    "tests.scheduling",
]
