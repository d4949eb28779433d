"""The soak's bounded smoke: one round with a seeded random fault (``make soak`` runs minutes)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.faults._report import record
from tests.faults.soak import soak

SEED = 20261201
ROUND_BOUND_S = 180.0


@pytest.mark.slow
async def test_one_soak_round_loses_and_doubles_nothing(tmp_path: Path) -> None:
    result = await asyncio.wait_for(soak(tmp_path, 0.0, SEED, sessions=20), ROUND_BOUND_S)
    record(
        "soak smoke (1 round, seeded random fault)",
        "lost 0, duplicated 0",
        seed=SEED,
        **result.summary(),
    )
    assert result.rounds == 1
    assert (result.lost, result.duplicated, result.wrong) == (0, 0, 0)
    assert result.acknowledged > 0
    assert result.persisted >= result.acknowledged
    assert result.verified == result.sessions
