"""The assembler's process GC policy (services/assembler/_gc.py)."""

from __future__ import annotations

import gc

from tokenwire.services.assembler import tune_gc


def test_tune_gc_raises_the_young_threshold_and_freezes_the_start_heap() -> None:
    before = gc.get_threshold()
    frozen = gc.get_freeze_count()
    try:
        assert tune_gc(12_345) == before
        assert gc.get_threshold() == (12_345, before[1], before[2])
        assert gc.get_freeze_count() > frozen
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
