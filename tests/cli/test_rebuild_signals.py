"""SIGINT and SIGTERM during ``tokenwire rebuild`` over 1,000 sessions (the installed entry
point, a real nats-server, a SQLite file): the process exits 130/143 between sessions, what it
reports is committed, and a second rebuild writes exactly what a clean rebuild would."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.test_bounded_commands import PROCESS_LIMIT_S, TOKENWIRE, _env
from tokenwire.broker import ChunkPublisher, EmbeddedServer, Topology, connect, ensure_topology
from tokenwire.cli._rebuild import rebuild_store
from tokenwire.schemas import ChunkEnvelope, Finish, StreamChunk, TextDelta, json_encoder
from tokenwire.services.assembler import AssemblyConfig
from tokenwire.store import Store, open_store

SESSIONS = 1000
PARTITIONS = 4

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def retained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A nats-server whose default topology retains SESSIONS sessions of one step each."""
    server = EmbeddedServer(tmp_path_factory.mktemp("rebuild-signals"))
    server.start()
    try:
        asyncio.run(_publish(server.url))
        yield server.url
    finally:
        server.stop()


async def _publish(url: str) -> None:
    t = Topology(partitions=PARTITIONS)
    nc = await connect(url)
    try:
        await ensure_topology(nc, t)
        publisher = await ChunkPublisher(nc, t).start()
        now = time.time_ns()
        for i in range(SESSIONS):
            chunks: list[StreamChunk] = [
                TextDelta(index=0, text=f"answer {i}"),
                Finish(reason="stop"),
            ]
            for ordinal, chunk in enumerate(chunks):
                env = ChunkEnvelope(
                    session=f"sig-{i:04d}",
                    turn=0,
                    step=0,
                    ordinal=ordinal,
                    time_ns=now + ordinal,
                    provider="scripted",
                    model="m",
                    chunk=chunk,
                )
                await publisher.publish(
                    json_encoder.encode(env), env.session, 0, 0, ordinal, first=ordinal == 0
                )
        await publisher.flush(60)
        await publisher.close()
    finally:
        await nc.close()


@pytest.fixture(scope="module")
def clean(retained: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The store a clean rebuild of every retained session writes (once per module). It is
    the oracle, never crashed: its commits skip the fsync (``synchronous=NORMAL``)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('clean') / 'clean.db'}?synchronous=NORMAL"

    async def go() -> None:
        store = open_store(url)
        try:
            assert await _rebuild_in_process(retained, store) == SESSIONS
        finally:
            await store.close()

    asyncio.run(go())
    return url


async def _same_as_clean(store: Store, clean_url: str) -> None:
    clean = open_store(clean_url)
    try:
        assert await store.stats() == await clean.stats()
        for i in range(0, SESSIONS, 37):
            session = f"sig-{i:04d}"
            assert await store.session_events(session) == await clean.session_events(session)
    finally:
        await clean.close()


async def _rebuild_in_process(url: str, store: Store) -> int:
    nc = await connect(url)
    try:
        report, _ = await rebuild_store(
            nc, Topology(partitions=PARTITIONS), store, None, AssemblyConfig()
        )
    finally:
        await nc.close()
    return sum(r.inserted for r in report)


async def _signalled_rebuild(url: str, db: Path, sig: signal.Signals) -> tuple[int, dict[str, int]]:
    """Start ``tokenwire rebuild --json``; signal it once its progress passed a tenth."""
    env = {**_env(db.parent), "TOKENWIRE_STORE": f"sqlite:///{db}"}
    proc = await asyncio.create_subprocess_exec(
        TOKENWIRE,
        "rebuild",
        "--json",
        "--nats-url",
        url,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(PROCESS_LIMIT_S):
            line = await proc.stderr.readline()
            assert line.startswith(b"rebuild: "), line
            proc.send_signal(sig)
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 128 + sig, (out + err).decode()[-3000:]
    assert f"stopped by {sig.name}".encode() in err
    return proc.returncode, json.loads(out)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
async def test_a_signalled_rebuild_leaves_nothing_half_written(
    retained: str, clean: str, tmp_path: Path, sig: signal.Signals
) -> None:
    db = tmp_path / "interrupted.db"
    _, summary = await _signalled_rebuild(retained, db, sig)
    assert 0 < summary["sessions"] < SESSIONS, "the signal did not arrive mid-rebuild"

    # the second rebuild's commits skip the fsync: what it writes is the claim, not whether
    # it survives a power loss (the signalled process above committed with the default FULL)
    interrupted = open_store(f"sqlite:///{db}?synchronous=NORMAL")
    try:
        committed = await interrupted.stats()
        assert committed.steps == summary["steps_written"] == summary["sessions"]
        second = await _rebuild_in_process(retained, interrupted)
        assert summary["steps_written"] + second == SESSIONS  # what a clean rebuild writes
        await _same_as_clean(interrupted, clean)
    finally:
        await interrupted.close()


async def _steps(db: Path) -> int:
    if not await asyncio.to_thread(db.exists):
        return 0
    store = open_store(f"sqlite:///{db}")
    try:
        return (await store.stats()).steps
    finally:
        await store.close()


async def test_sigterm_stops_the_assembler_between_commits_and_a_restart_finishes(
    retained: str, clean: str, tmp_path: Path
) -> None:
    """``tokenwire assembler`` committing one step a transaction gets SIGTERM after its first
    commit: it exits 143 having acknowledged only what it committed; a burst run (default
    batches) commits the rest, and the store equals a clean rebuild's (nothing half-written,
    nothing doubled)."""
    db = tmp_path / "assembled.db"
    env = {
        **_env(tmp_path),
        "TOKENWIRE_STORE": f"sqlite:///{db}",
        "TOKENWIRE_NATS_URL": retained,
        "TOKENWIRE_ASSEMBLER_BATCH_STEPS": "1",
        "TOKENWIRE_ASSEMBLER_METRICS_ADDR": "off",
    }
    proc = await asyncio.create_subprocess_exec(
        TOKENWIRE,
        "assembler",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(PROCESS_LIMIT_S):
            while True:  # until the first commit (bounded by the timeout)
                if await _steps(db):
                    break
                await asyncio.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            _, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 143, err.decode()[-3000:]
    # How much of the backlog was committed before the signal depends on the machine (each
    # commit is one step); whatever it was, the rest must follow without a hole or a double.
    assert await _steps(db) > 0

    # The restart commits in its default batches and without the fsync: one step a
    # transaction (fsynced) is what the signal needed to land between commits; the rest only
    # has to follow without a hole or a double.
    burst_env = {k: v for k, v in env.items() if k != "TOKENWIRE_ASSEMBLER_BATCH_STEPS"}
    burst_env["TOKENWIRE_STORE"] = f"sqlite:///{db}?synchronous=NORMAL"
    burst = await asyncio.create_subprocess_exec(
        TOKENWIRE,
        "assembler",
        "--burst",
        env=burst_env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(PROCESS_LIMIT_S):
        _, err = await burst.communicate()
    assert burst.returncode == 0, err.decode()[-3000:]

    assembled = open_store(f"sqlite:///{db}")
    try:
        await _same_as_clean(assembled, clean)
    finally:
        await assembled.close()
