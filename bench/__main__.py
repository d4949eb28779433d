"""``make bench``: run every benchmark (or those named in argv) and print their tables.

Each benchmark measures tokenwire beside a baseline in the same run and prints the ratio;
the tables are also written to ``bench/results/<name>.md``.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from pathlib import Path

import bench


def main(argv: list[str]) -> int:
    names = sorted(
        m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_")
    )
    wanted = [n for n in names if not argv or any(a in n for a in argv)]
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    for name in wanted:
        print(f"\n## {name.removeprefix('bench_')}\n", flush=True)
        started = time.perf_counter()
        table: str = importlib.import_module(f"bench.{name}").main()
        print(table, flush=True)
        print(f"\n({time.perf_counter() - started:.1f} s)", flush=True)
        (out_dir / f"{name}.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
