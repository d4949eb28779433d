"""The one-run benchmark suite behind ``make bench``: profiles, the figures it records, phases.

A *profile* sets the sizes (``smoke``: seconds, for the test suite; ``default``: ``make bench``,
~12 min on 2 idle cores; ``long``: the issue's full sizes, 1M-chunk steps and 2,000 sessions).
Each phase records named figures into one :class:`Figures` object that is written as JSON
(``bench/results/results.json``); the report and the capacity model are computed from it.
"""

from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

Profile = Literal["smoke", "default", "long"]
PROFILES: tuple[Profile, ...] = ("smoke", "default", "long")
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Figures:
    """Every figure of a run: ``values[phase][name] = number``, tables and curves by phase."""

    profile: Profile
    values: dict[str, dict[str, float]] = field(default_factory=dict)
    tables: dict[str, str] = field(default_factory=dict)
    curves: dict[str, dict[str, list[list[float]]]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)

    def put(self, phase: str, name: str, value: float) -> None:
        """Record one figure (a plain float, so the JSON stays flat)."""
        self.values.setdefault(phase, {})[name] = float(value)

    def get(self, phase: str, name: str, default: float = float("nan")) -> float:
        """A recorded figure, ``default`` when that phase or figure did not run."""
        return self.values.get(phase, {}).get(name, default)

    def curve(self, phase: str, name: str, points: list[tuple[float, float]]) -> None:
        """Record a curve as (x, y) points."""
        self.curves.setdefault(phase, {})[name] = [[float(x), float(y)] for x, y in points]

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "values": self.values,
            "tables": self.tables,
            "curves": self.curves,
            "notes": self.notes,
            "seconds": self.seconds,
            "machine": self.machine,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Figures:
        return cls(
            profile=doc["profile"],
            values=doc.get("values", {}),
            tables=doc.get("tables", {}),
            curves=doc.get("curves", {}),
            notes=doc.get("notes", {}),
            seconds=doc.get("seconds", {}),
            machine=doc.get("machine", {}),
        )

    def merge(self, other: Figures) -> None:
        """Keep ``other``'s phases that this run did not measure (``make bench BENCH=x``)."""
        for attr in ("values", "tables", "curves", "notes", "seconds"):
            mine, theirs = getattr(self, attr), getattr(other, attr)
            for key, value in theirs.items():
                mine.setdefault(key, value)


def machine() -> dict[str, Any]:
    """What the figures were measured on (wall clock read here, at run time)."""
    load = os.getloadavg()
    return {
        "when_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "system": f"{platform.system()} {platform.release()}",
        "load_at_start": round(load[0], 2),
    }


def save(figures: Figures, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures.to_json(), indent=1, sort_keys=True) + "\n")


def load(path: Path) -> Figures | None:
    if not path.is_file():
        return None
    return Figures.from_json(json.loads(path.read_text()))


def pct(samples: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) by rank, as bench_gateway reports it."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def sizes(profile: Profile, smoke: Any, default: Any, long: Any) -> Any:
    """The size for ``profile``."""
    return {"smoke": smoke, "default": default, "long": long}[profile]
