"""``tokenwire rebuild --repair`` on a store damaged as issue 48 found it, against a real
nats-server and both databases.

The damage is built here the way the bug made it: an assembler that fell behind during a
broker outage committed steps whose first chunks it had read as ``abandoned`` errors (the
records come from the assembler's own core, fed those first chunks and expired), and one step
was stored with a chunk missing from its log. Then the real assembler drains the stream into
that store, skipping the damaged steps as stored, and a plain ``tokenwire rebuild`` writes
nothing. The oracles: ``replay --verify`` (the fold of the retained chunks), and the script's
own figures (each step's outcome kind and reported usage, the session's chunk count).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.cli.test_bounded_commands import PROCESS_LIMIT_S, TOKENWIRE
from tests.replay.sessions import SCRIPT, by_step, envelopes, publish
from tokenwire.broker import EmbeddedServer, Topology, connect, ensure_topology
from tokenwire.cli._rebuild import rebuild_store
from tokenwire.replay import verify
from tokenwire.schemas import ChunkEnvelope, ChunkEvent, TokenUsage, Usage
from tokenwire.services.assembler import AssemblerSettings, Assembly, AssemblyConfig, run
from tokenwire.store import StepRecord, Store, open_store

pytestmark = pytest.mark.slow

PARTITIONS = 4
SESSIONS = [f"rp-{i}" for i in range(6)]
ABANDONED = {("rp-0", 0, 0): 1, ("rp-1", 1, 0): 2, ("rp-2", 2, 0): 1, ("rp-3", 1, 1): 3}
"""Steps stored as abandoned errors, with how many of their first chunks the assembler read."""
CHUNK_DROPPED = ("rp-4", 1, 0)
"""A step stored with its right message but without its chunk of ordinal 2."""
OUTCOME_KINDS = {(0, 0): "message", (1, 0): "message", (1, 1): "message", (2, 0): "error"}
REPORTED = {(0, 0): TokenUsage(120, 60), (1, 0): TokenUsage(200, 30), (1, 1): None, (2, 0): None}
"""The usage each step of the script reports (the usage chunks written in its script)."""


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[str]:
    """A server of the test's own, the CLI's default topology, every session published."""
    async with EmbeddedServer(tmp_path / "nats") as server:
        nc = await connect(server.url)
        try:
            await ensure_topology(nc, Topology(partitions=PARTITIONS))
            for i, session in enumerate(SESSIONS):
                await publish(
                    nc,
                    Topology(partitions=PARTITIONS),
                    envelopes(session),
                    frame_size=8 if i % 2 else 0,
                )
        finally:
            await nc.close()
        yield server.url


def _abandoned(chunks: list[ChunkEnvelope], kept: int) -> StepRecord:
    """What the assembler stored for a step it read only ``kept`` chunks of before the outage:
    its core fed those, then expired past the abandon timeout."""
    assembly: Assembly[int] = Assembly(AssemblyConfig(), clock=lambda: chunks[kept - 1].time_ns)
    for seq, envelope in enumerate(chunks[:kept]):
        assert assembly.feed(envelope, seq) is None
    [closed] = assembly.expire(chunks[kept - 1].time_ns + 121 * 10**9)
    assert closed.reason == "abandoned"
    return closed.record


def _dropped(chunks: list[ChunkEnvelope]) -> StepRecord:
    from tokenwire.fold import fold

    kept = [c for c in chunks if c.ordinal != 2]
    first = chunks[0]
    return StepRecord(
        first.session,
        first.turn,
        first.step,
        first.provider,
        first.model,
        kept,
        fold(c.chunk for c in chunks),
        chunks[-1].time_ns,
    )


async def _damage(store: Store) -> int:
    """Commit the damaged steps, as the lagging assembler did; returns how many."""
    records = []
    for session in SESSIONS:
        for (turn, step), chunks in by_step(envelopes(session)).items():
            key = (session, turn, step)
            if key in ABANDONED:
                records.append(_abandoned(chunks, ABANDONED[key]))
            elif key == CHUNK_DROPPED:
                records.append(_dropped(chunks))
    await store.commit(records)
    return len(records)


async def _tokenwire(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        TOKENWIRE, *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), PROCESS_LIMIT_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _differences(url: str, store: Store) -> list[tuple[str, int, int, str]]:
    """``replay --verify``'s differences over every session."""
    nc = await connect(url)
    try:
        t = Topology(partitions=PARTITIONS)
        return [
            (s, d.turn, d.step, d.kind) for s in SESSIONS for d in await verify(nc, t, store, s)
        ]
    finally:
        await nc.close()


async def _check_against_the_script(store: Store) -> None:
    """Each step's outcome kind and reported usage as the script wrote them; every session's
    seqs contiguous from 1, each outcome citing its own chunks; the counters and the rollup
    agree with the lines."""
    total_chunks = sum(len(chunks) for chunks in SCRIPT.values())
    for session in SESSIONS:
        outcomes = {(o.turn, o.step): o for o in await store.messages(session)}
        assert {k: type(o).__name__ for k, o in outcomes.items()} == {
            k: "MessageEvent" if v == "message" else "ErrorEvent" for k, v in OUTCOME_KINDS.items()
        }, session
        lines = {(line.turn, line.step): line for line in await store.session_usage(session)}
        assert {k: line.usage for k, line in lines.items()} == REPORTED, session
        assert {k: line.outcome_kind for k, line in lines.items()} == OUTCOME_KINDS, session
        events = await store.session_events(session)
        seqs = [e.seq for e in events if isinstance(e, ChunkEvent)]
        assert seqs == list(range(1, total_chunks + 1)), session
        for key, outcome in outcomes.items():
            cited = [
                e.seq
                for e in events
                if isinstance(e, ChunkEvent) and (e.envelope.turn, e.envelope.step) == key
            ]
            assert cited == list(range(outcome.seq_start, outcome.seq_end + 1)), (session, key)
        summary = await store.session(session)
        assert summary is not None
        assert (summary.steps, summary.messages, summary.errors, summary.chunks) == (
            4,
            3,
            1,
            total_chunks,
        )
    [group] = await store.usage("model")
    assert group.totals.steps == 4 * len(SESSIONS)
    assert group.totals.input_tokens == 320 * len(SESSIONS)
    assert group.totals.output_tokens == 90 * len(SESSIONS)


async def test_a_damaged_store_is_repaired_once_to_no_difference(
    broker: str, db_url: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENWIRE_")}
    env |= {
        "TOKENWIRE_NATS_URL": broker,
        "TOKENWIRE_STORE": db_url,
        "TOKENWIRE_PARTITIONS": str(PARTITIONS),
        "TOKENWIRE_DATA_DIR": str(tmp_path),
    }
    store = open_store(db_url)
    try:
        damaged = await _damage(store)
        settings = AssemblerSettings(
            nats_urls=(broker,),
            store_url=db_url,
            topology=Topology(partitions=PARTITIONS),
            burst=True,
            metrics_addr=None,
            provision=False,
        )
        await run(settings, store=store)  # the real assembler skips the damaged steps as stored
        before = await _differences(broker, store)
        assert {d[:3] for d in before} == {*ABANDONED, CHUNK_DROPPED}
        assert {d[3] for d in before if d[:3] in ABANDONED} <= {"outcome", "error", "chunks"}
        assert (*CHUNK_DROPPED, "chunks") in before
        nc = await connect(broker)
        try:  # the bug: a rebuild writes nothing for them
            plain, _ = await rebuild_store(
                nc, Topology(partitions=PARTITIONS), store, None, AssemblyConfig()
            )
        finally:
            await nc.close()
        assert sum(r.inserted for r in plain) == 0
        assert not any(r.repairs for r in plain)
    finally:
        await store.close()

    code, out, err = await _tokenwire(["rebuild", "--repair", "--json"], env)
    first = json.loads(out)
    assert code == 0, err
    assert (first["repaired"], first["steps_written"], first["left"]) == (damaged, 0, [])
    repaired = {(r["session"], r["turn"], r["step"]) for r in first["repairs"]}
    assert repaired == {*ABANDONED, CHUNK_DROPPED}

    code, out, err = await _tokenwire(["rebuild", "--repair"], env)
    assert code == 0, err
    assert out.splitlines()[-1].endswith("; 0 steps repaired")
    store = open_store(db_url)
    try:
        assert await _differences(broker, store) == []
        await _check_against_the_script(store)
    finally:
        await store.close()
    print(
        f"\nrepair: {len(before)} differences over {damaged} damaged steps; "
        f"{first['repaired']} repaired; second run 0"
    )


def test_usage_of_the_script_is_what_the_oracle_says() -> None:
    """The oracle's figures are the script's usage chunks (a typo here would pass the repair
    test against the wrong numbers)."""
    reported = {
        key: next((c.usage for c in chunks if isinstance(c, Usage)), None)
        for key, chunks in SCRIPT.items()
    }
    assert reported == REPORTED
