"""A dropped connection never pays twice (issue 28; docs/gateway.md, "Resuming a step").

Each caller dialect (chat, messages, responses) against each provider dialect the scripted
provider serves (OpenAI Chat, Anthropic), its connection cut at a point a seeded RNG picks
within each phase (before the first byte, mid-text, mid-tool-call, after the finish): the
official SDK then sends the same request again and must get exactly the answer it assembles
from an uninterrupted run (through a reference gateway on another topology); the scripted
provider was called once for the step; the assembler stores one message for it.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from nats.aio.client import Client

from tests.assembler.harness import settings_for as assembler_settings
from tests.gateway._resume_rig import (
    CALLERS,
    Case,
    Sent,
    cases,
    cut_run,
    final_answer,
    fixed_clock,
    gateway,
    reference_topology,
    scripted_server,
)
from tokenwire.broker import Topology
from tokenwire.schemas import MessageEvent
from tokenwire.services.assembler import run as run_assembler
from tokenwire.store import open_store

SEED = int(os.environ.get("RESUME_SEED", random.randrange(1 << 32)))


async def stored_messages(nats_url: str, topology: Topology, store_url: str, session: str):
    """The assembler, run to the end of the stream (burst), then the session's stored rows."""
    await run_assembler(assembler_settings(nats_url, topology, store_url))
    store = open_store(store_url)
    try:
        return await store.messages(session)
    finally:
        await store.close()


@pytest.mark.parametrize("caller", CALLERS)
async def test_a_cut_step_retried_with_the_sdk_resumes_without_a_second_call(
    caller: str, nc: Client, topology: Topology, nats_url: str, tmp_path: Path
) -> None:
    print(f"RESUME_SEED={SEED}")
    clock = fixed_clock()
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    checked: list[Case] = []
    async with (
        scripted_server() as scripted,
        reference_topology(nc) as ref_topology,
        gateway(nc, ref_topology, scripted.url, clock) as reference,
        gateway(nc, topology, scripted.url, clock) as url,
    ):
        for case in cases(caller, SEED):
            sent = Sent()
            expected = await final_answer(reference, case, sent)
            before = len(scripted.received)
            await cut_run(url, case, sent.bodies[-1])
            assert len(scripted.received) == before + 1, case
            resumed = await final_answer(url, case, Sent())
            assert resumed == expected, case
            assert len(scripted.received) == before + 1, f"{case}: a second provider call"
            checked.append(case)
    for case in checked:
        rows = await stored_messages(nats_url, topology, store_url, case.session)
        assert [(type(r), r.turn, r.step) for r in rows] == [(MessageEvent, 0, 0)], case
