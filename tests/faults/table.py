"""Regenerate docs/reliability.md's measured table from the fault tier's JSON lines.

    .venv/bin/python -m tests.faults.table .faults.jsonl docs/reliability.md

The rows replace everything between the ``<!-- faults:begin -->`` and ``<!-- faults:end -->``
markers; the rest of the page is left as written. The last row of each case wins.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

BEGIN, END = "<!-- faults:begin -->", "<!-- faults:end -->"
SKIP = {"case", "promise"}


def _measured(row: dict[str, object]) -> str:
    parts = []
    for key, value in row.items():
        if key in SKIP or value in ({}, [], None):
            continue
        shown = value
        if isinstance(value, dict):
            shown = ", ".join(f"{k} {v}" for k, v in value.items())
        elif isinstance(value, list):
            shown = " ".join(str(v) for v in value)
        parts.append(f"{key.replace('_', ' ')}: {shown}")
    return "; ".join(parts).replace("|", "/")


def table(lines: list[str]) -> str:
    rows: dict[str, dict[str, object]] = {}
    for line in lines:
        if line.strip():
            row = json.loads(line)
            if "failures" in row:  # long texts; the counts say it
                row["failures"] = sum(row["failures"].values()) if row["failures"] else 0
            rows[str(row["case"])] = row
    out = ["| fault | promised | measured |", "| --- | --- | --- |"]
    out += [
        f"| {case} | {row.get('promise', '')} | {_measured(row)} |" for case, row in rows.items()
    ]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    report, page = Path(argv[0]), Path(argv[1])
    text = page.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    page.write_text(f"{head}{BEGIN}\n{table(report.read_text().splitlines())}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
