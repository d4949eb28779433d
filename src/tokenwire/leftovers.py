"""What a process would leave unflushed if it stopped now: each part says, the stop bound tells.

A service registers a describer while it holds work that a stop could cut short (steps not
committed, chunks not acknowledged) with :meth:`Leftovers.add`, and removes it once stopped:
the removal keeps its last words (what it still left, if anything). After a signal the command
runner logs :meth:`Leftovers.lines` (the last words, then every part still registered) when
the stop ends and when it is cut at the stop bound (``TOKENWIRE_STOP_TIMEOUT_S``), so an
operator reads what was left and why nothing acknowledged is lost (what was not acknowledged
is redelivered). The process has one registry, :data:`LEFTOVERS`, as it has one set of
signal handlers.

Example::

    remove = LEFTOVERS.add("assembler", lambda: f"{pending} steps not committed")
    try:
        ...  # run, then stop
    finally:
        remove()

Describers are called from the runner's watchdog thread too: they only read counters.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable

Describe = Callable[[], str]
"""What a part would leave now, in a few words; ``""`` when nothing."""


class Leftovers:
    """Named describers of what the process's parts would leave unflushed."""

    def __init__(self, last_words: int = 64) -> None:
        self._parts: dict[int, tuple[str, Describe]] = {}
        self._keys = itertools.count()
        self._said: deque[str] = deque(maxlen=last_words)

    def add(self, name: str, describe: Describe) -> Callable[[], None]:
        """Register ``describe`` under ``name``; returns the function that removes it and
        keeps its last words (the most recent ``last_words`` of them)."""
        key = next(self._keys)
        self._parts[key] = (name, describe)

        def remove() -> None:
            part = self._parts.pop(key, None)
            if part is not None and (line := _line(*part)):
                self._said.append(line)

        return remove

    def lines(self) -> list[str]:
        """``name: description``: the last words of the parts removed, then every part still
        registered that would leave something."""
        now = [line for part in list(self._parts.values()) if (line := _line(*part))]
        return [*self._said, *now]


def _line(name: str, describe: Describe) -> str:
    try:
        text = describe()
    except Exception as exc:
        text = f"(could not tell: {type(exc).__name__}: {exc})"  # a report must not fail a stop
    return f"{name}: {text}" if text else ""


def counted(n: int, noun: str) -> str:
    """``"1 open step"``, ``"2 open steps"``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


LEFTOVERS = Leftovers()
"""The process's registry."""
