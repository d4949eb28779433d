"""The assembler process's garbage-collector policy.

Every chunk the assembler takes is held (its message, ack token and envelope) until its step
is committed, so nearly every object it allocates survives the young collections and is
promoted. With CPython's default thresholds ``(700, 10, 10)`` that promotes the whole held
set into the old generation over and over, and a full collection runs every time it grew by
a quarter, scanning every live object: bench/bench_assembler.py measured 14 full collections
of 130-350 ms each per 100,000 chunks, about half the assembler's throughput and most of its
publish-to-commit p99.

The policy: freeze what exists at start (modules, configuration; never garbage), and collect
the young generation every ``young_threshold`` net allocations instead of 700. Cyclic garbage
(rare here: reference counting frees the messages) waits a little longer; nothing else
changes. It is process-wide, so :func:`~tokenwire.services.assembler.run` applies it only
when ``AssemblerSettings.tune_gc`` is set (the default for the service).
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
"""Net allocations between young collections (CPython's default: 700). One young collection
of this many objects takes ~10-20 ms on the 2-core dev machine, within the latency budget."""


def tune_gc(young_threshold: int = YOUNG_THRESHOLD) -> tuple[int, int, int]:
    """Apply the assembler's GC policy to this process; returns the previous thresholds."""
    previous = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(young_threshold, previous[1], previous[2])
    return previous
