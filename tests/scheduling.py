"""How the suite spreads over pytest-xdist workers (``make test`` runs ``-n 4 --dist loadscope``;
ADR 0038 says why and how the worker count was chosen).

- Every test module is one unit of work, so a module-scoped fixture (a module's own broker, the
  benchmark run of tests/bench/test_smoke.py) is set up once, on one worker.
- A few units join modules that share an expensive session fixture: see :data:`GROUPS`.
- Units with slow tests start first, those with the most slow tests before the others (the
  ``slow`` mark is the only estimate of length a clean clone has), so the long units run
  beside each other while short ones fill the gaps, and only short units are left at the end
  to even out the workers.

Without xdist (a targeted ``pytest path``) only the order changes, module by module, never
splitting a module.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

GROUPS = {
    # Both use the session fixture ``built`` (tests/deploy/conftest.py: uv build of the checkout).
    "tests/deploy/test_image.py": "wheel",
    "tests/deploy/test_wheel.py": "wheel",
}
"""Module path -> the unit it joins (otherwise a module is its own unit)."""


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or the group its module joins."""
    module = nodeid.split("::", 1)[0]
    return GROUPS.get(module, module)


class UnitScheduling(LoadScopeScheduling):  # type: ignore[misc]  # xdist ships no types
    """xdist's ``loadscope`` with :func:`unit_of` as the scope, in collection order.

    (xdist's ``loadgroup`` would read ``xdist_group`` marks, but it passes them by rewriting
    node ids, which pytest 9.2 no longer honours: pytest-xdist issue 1386.)
    """

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> UnitScheduling | None:
    if config.getvalue("dist") != "loadscope":
        return None
    config.option.loadscopereorder = False  # the collection order below is the schedule
    return UnitScheduling(config, log)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    slow: Counter[str] = Counter()
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        unit = unit_of(item.nodeid)
        first_seen.setdefault(unit, i)
        slow[unit] += item.get_closest_marker("slow") is not None
    items.sort(key=lambda item: (-slow[unit_of(item.nodeid)], first_seen[unit_of(item.nodeid)]))
