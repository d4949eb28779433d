"""The assembler process's garbage-collector policy.

Every chunk the assembler takes is held until its step is committed, so nearly every object it
allocates survives the young collections, and with CPython's default thresholds full
collections scanning every live object ran over and over (docs/assembler.md, "Performance",
gives what they cost). The policy: freeze what exists at start, and collect the young
generation every ``young_threshold`` net allocations instead of 700. It is process-wide, so
:func:`~tokenwire.services.assembler.run` applies it only when ``AssemblerSettings.tune_gc``
is set (the default for the service).
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
