"""SessionProgress: a rich bar on a terminal, a plain line per tenth otherwise (both stderr)."""

from __future__ import annotations

import io
from dataclasses import dataclass

from tokenwire.cli._progress import SessionProgress


@dataclass
class _Done:
    session: str


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_without_a_terminal() -> None:
    out = io.StringIO()
    with SessionProgress("rebuild", stream=out) as progress:
        progress.start(25)
        for i in range(25):
            progress.advance(_Done(f"s{i}"))
    lines = out.getvalue().splitlines()
    assert lines[0] == "rebuild: 2/25 sessions"
    assert lines[-1] == "rebuild: 25/25 sessions"
    assert len(lines) == 13  # every 2nd of 25 (a tenth, rounded down), and the last


def test_a_bar_on_a_terminal() -> None:
    out = _Terminal()
    with SessionProgress("verify", stream=out) as progress:
        progress.start(3)
        for i in range(3):
            progress.advance(_Done(f"s{i}"))
    text = out.getvalue()
    assert "verify: " not in text  # not the plain lines
    assert "\x1b[" in text  # rich drew (and cleared) a live display
