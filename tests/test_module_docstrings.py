"""Module docstrings say what the module is and where to read more, in a few lines; measured
figures and history live in docs/benchmarks.md and the ADRs (issue 44)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "tokenwire"
MAX_LINES = 20
MAX_PACKAGE_LINES = 30
"""A package's ``__init__`` lists its public surface too."""
FIGURE = re.compile(
    r"~\s?\d|\b\d+(?:[.,]\d+)?\s?(?:us|µs|ms)\b|\b\d+(?:\.\d+)?\s?%|\b\d+(?:\.\d+)?x\b"
    r"|bench/bench_\w+\.py"
)
"""A measured figure: an approximate number, a duration in us or ms, a percentage, a ratio,
or a benchmark cited as its source."""

MODULES = sorted(SRC.rglob("*.py"))


def _docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def _limit(path: Path) -> int | None:
    """The line budget of ``path``'s docstring; None for an exception tree (PRINCIPLES.md 5:
    each package draws its tree in its errors module's docstring)."""
    if path.name == "_errors.py":
        return None
    return MAX_PACKAGE_LINES if path.name == "__init__.py" else MAX_LINES


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_a_module_docstring_is_a_few_lines(path: Path) -> None:
    limit = _limit(path)
    lines = len(_docstring(path).splitlines())
    assert limit is None or lines <= limit, f"{lines} lines: move the detail to docs/"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_a_module_docstring_carries_no_measured_figure(path: Path) -> None:
    figures = [line.strip() for line in _docstring(path).splitlines() if FIGURE.search(line)]
    assert figures == [], "measured figures belong in docs/benchmarks.md or the ADR"


def test_the_figure_check_sees_figures() -> None:
    said = [
        "costs ~0.4 ms at p50",
        "about 3-4 us a message",
        "~15% of the CPU",
        "2x the events/s",
        "(bench/bench_gateway.py (d))",
    ]
    assert all(FIGURE.search(s) for s in said)
    assert not any(FIGURE.search(s) for s in ("ADR 0008", "at most 64 blocks", "HTTP/1.1"))
