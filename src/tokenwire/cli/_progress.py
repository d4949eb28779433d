"""Progress of long commands over many sessions: a rich bar on a terminal, plain lines else.

Progress goes to stderr, so stdout keeps only the result (the summary, or ``--json``).
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Protocol, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

PLAIN_LINES = 10
"""Without a terminal, one line per tenth of the work (and the last)."""


class _Done(Protocol):
    @property
    def session(self) -> str: ...


class SessionProgress:
    """``with SessionProgress("rebuild") as p: p.start(total); p.advance(done)...``"""

    def __init__(self, verb: str, *, stream: TextIO | None = None) -> None:
        self._verb = verb
        self._stream = stream if stream is not None else sys.stderr
        self._terminal = self._stream.isatty()
        self._bar: Progress | None = None
        self._task: int | None = None
        self._total = 0
        self._done = 0

    def __enter__(self) -> SessionProgress:
        if self._terminal:
            self._bar = Progress(
                TextColumn(f"{self._verb} {{task.fields[session]}}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=Console(file=self._stream),
                transient=True,
            )
            self._bar.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._bar is not None:
            self._bar.stop()

    def start(self, total: int) -> None:
        """The number of sessions to do is known."""
        self._total = total
        if self._bar is not None:
            self._task = self._bar.add_task(self._verb, total=total, session="")

    def advance(self, done: _Done) -> None:
        """One more session is done."""
        self._done += 1
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, advance=1, session=done.session)  # type: ignore[arg-type]  # rich's update takes extra fields as keyword arguments
            return
        step = max(1, self._total // PLAIN_LINES)
        if self._done % step == 0 or self._done == self._total:
            print(f"{self._verb}: {self._done}/{self._total} sessions", file=self._stream)
