"""The fault tier's measured rows, for docs/reliability.md (``make reliability-table``).

Each case appends one JSON line to ``$TOKENWIRE_FAULTS_REPORT`` when it is set (and always
prints its row, visible with ``-s``); ``tests/faults/table.py`` turns the lines into the table.
"""

from __future__ import annotations

import json
import os
from typing import Any


def record(case: str, promise: str, **measured: Any) -> None:
    row = {"case": case, "promise": promise, **measured}
    print(f"\nFAULT {json.dumps(row)}")
    path = os.environ.get("TOKENWIRE_FAULTS_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(row) + "\n")
