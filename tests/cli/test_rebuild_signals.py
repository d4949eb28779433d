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
from tokenwire.schemas import ChunkEnvelope, Finish, TextDelta, json_encoder
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
            chunks = [TextDelta(index=0, text=f"answer {i}"), Finish(reason="stop")]
            for ordinal, chunk in enumerate(chunks):
                env = ChunkEnvelope(session=f"sig-{i:04d}", turn=0, step=0, ordinal=ordinal,
                                    time_ns=now + ordinal, provider="scripted", model="m",
                                    chunk=chunk)  # fmt: skip
                await publisher.publish(json_encoder.encode(env), env.session, 0, 0, ordinal,
                                        first=ordinal == 0)  # fmt: skip
        await publisher.flush(60)
        await publisher.close()
    finally:
        await nc.close()


async def _rebuild_in_process(url: str, store: Store) -> int:
    nc = await connect(url)
    try:
        report, _ = await rebuild_store(nc, Topology(partitions=PARTITIONS), store, None,
                                        AssemblyConfig())  # fmt: skip
    finally:
        await nc.close()
    return sum(r.inserted for r in report)


async def _signalled_rebuild(url: str, db: Path, sig: signal.Signals) -> tuple[int, dict[str, int]]:
    """Start ``tokenwire rebuild --json``; signal it once its progress passed a tenth."""
    env = {**_env(db.parent), "TOKENWIRE_STORE": f"sqlite:///{db}"}
    proc = await asyncio.create_subprocess_exec(
        TOKENWIRE, "rebuild", "--json", "--nats-url", url, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
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
    retained: str, tmp_path: Path, sig: signal.Signals
) -> None:
    db = tmp_path / "interrupted.db"
    _, summary = await _signalled_rebuild(retained, db, sig)
    assert 0 < summary["sessions"] < SESSIONS, "the signal did not arrive mid-rebuild"

    interrupted, clean = open_store(f"sqlite:///{db}"), open_store(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        committed = await interrupted.stats()
        assert committed.steps == summary["steps_written"] == summary["sessions"]
        second = await _rebuild_in_process(retained, interrupted)
        from_scratch = await _rebuild_in_process(retained, clean)
        assert summary["steps_written"] + second == from_scratch == SESSIONS
        assert await interrupted.stats() == await clean.stats()
        for i in range(0, SESSIONS, 37):
            session = f"sig-{i:04d}"
            assert await interrupted.session_events(session) == await clean.session_events(session)
    finally:
        await interrupted.close()
        await clean.close()
