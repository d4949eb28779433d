"""``tokenwire reshard`` (docs/operations.md, "Changing the shard count") against a real
nats-server: refused while the old layout is not drained, and by every process of the new
layout before the switch; after it, sessions written before stay readable and verify from the
retired stream, new sessions land on the new shards, and a second run changes nothing.

The CLI uses the default names (prefix ``tw``, stream ``TOKENWIRE``): this module runs its own
server. The drain is done by the real services (``assembler --burst``, ``telemetry --burst``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.broker import close_client, own_server
from tests.replay.sessions import commit_folded, envelopes, publish
from tokenwire.broker import Topology, connect, free_port, retained_sessions
from tokenwire.broker._api import api_request
from tokenwire.cli import main
from tokenwire.store import open_store

PARTITIONS = 4
OLD = Topology(partitions=PARTITIONS)
NEW = Topology(partitions=PARTITIONS, shards=2)
BURST_BOUND_S = 60.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from own_server(tmp_path_factory, "reshard-nats")


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, server: str) -> dict[str, str]:
    values = {
        "TOKENWIRE_NATS_URL": server,
        "TOKENWIRE_STORE": f"sqlite:///{tmp_path / 'store.db'}",
        "TOKENWIRE_DATA_DIR": str(tmp_path / "data"),
        "TOKENWIRE_PARTITIONS": str(PARTITIONS),
        "TOKENWIRE_SHARDS": "1",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def recorded(env: dict[str, str], topology: Topology, tag: str) -> str:
    """A scripted session published with ``topology`` and committed to the store."""
    session = f"{tag}-{uuid.uuid4().hex[:8]}"
    sent = envelopes(session)

    async def go() -> None:
        nc = await connect(env["TOKENWIRE_NATS_URL"])
        try:
            await publish(nc, topology, sent)
        finally:
            await close_client(nc)
        store = open_store(env["TOKENWIRE_STORE"])
        try:
            await commit_folded(store, sent)
        finally:
            await store.close()

    asyncio.run(go())
    return session


def burst(env: dict[str, str], service: str) -> None:
    """Run a service until what is pending is handled (its drain), as a process."""
    extra = {
        "TOKENWIRE_ASSEMBLER_METRICS_ADDR": "off",
        "TOKENWIRE_ASSEMBLER_TUNE_GC": "0",
        "TOKENWIRE_TELEMETRY_METRICS_ADDR": f"127.0.0.1:{free_port()}",
    }
    result = subprocess.run(
        [sys.executable, "-m", "tokenwire", service, "--burst"],
        env={**os.environ, **env, **extra},
        capture_output=True,
        text=True,
        timeout=BURST_BOUND_S,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]


async def _stream(url: str, name: str) -> dict[str, object]:
    nc = await connect(url)
    try:
        return await api_request(nc, f"$JS.API.STREAM.INFO.{name}")
    finally:
        await close_client(nc)


async def _retained(url: str) -> set[str]:
    nc = await connect(url)
    try:
        return await retained_sessions(nc, NEW)
    finally:
        await close_client(nc)


@pytest.mark.slow
def test_reshard_keeps_old_sessions_readable_and_moves_new_ones(
    env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    url = env["TOKENWIRE_NATS_URL"]
    assert main(["provision"]) == 0
    old = [recorded(env, OLD, "old") for _ in range(3)]
    capsys.readouterr()

    # Not drained: nothing consumed yet. Refused, nothing changed.
    assert main(["reshard", "--shards", "2"]) == 1
    err = capsys.readouterr().err
    assert "not drained" in err
    assert "assembler-p" in err
    # A process of the new layout refuses to start against the old one (exit 2, one line).
    assert main(["provision", "--shards", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    for named in ("K=1: TOKENWIRE", "K=2 P=4", "TOKENWIRE_K2_P4_S0", "tokenwire reshard"):
        assert named in err

    burst(env, "assembler")
    burst(env, "telemetry")
    held = asyncio.run(_stream(url, "TOKENWIRE"))["state"]
    assert main(["reshard", "--shards", "2"]) == 0
    out = capsys.readouterr().out
    assert "K=1 P=4 -> K=2 P=4; retired TOKENWIRE" in out
    retired = asyncio.run(_stream(url, "TOKENWIRE"))
    assert retired["config"]["subjects"] == ["tw.retired.K1.P4.TOKENWIRE"]  # type: ignore[index]
    assert retired["state"]["messages"] == held["messages"] > 0  # type: ignore[index]
    # its reservation shrinks to what it holds (the new streams need the file store)
    assert retired["config"]["max_bytes"] < OLD.max_bytes  # type: ignore[index]
    assert retired["config"]["max_bytes"] >= held["bytes"]  # type: ignore[index]

    env["TOKENWIRE_SHARDS"] = "2"
    new = [recorded(env, NEW, "new") for _ in range(4)]
    for session in new:  # each on its own shard's stream, none on the retired one
        subjects = asyncio.run(_subjects(url, NEW.stream_of(session), session))
        assert subjects, session
        assert not asyncio.run(_subjects(url, "TOKENWIRE", session))
    for session in old + new:
        assert main(["replay", session, "--verify", "--shards", "2"]) == 0, session
    capsys.readouterr()
    assert main(["replay", old[0], "--max", "--json", "--shards", "2"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert set(old + new) <= asyncio.run(_retained(url))

    assert main(["reshard", "--shards", "2"]) == 0  # idempotent
    assert "retired nothing" in capsys.readouterr().out
    assert main(["status", "--json", "--shards", "2"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [s["name"] for s in report["streams"]] == list(NEW.chunk_streams)
    assert [r["name"] for r in report["retired"]] == ["TOKENWIRE"]


async def _subjects(url: str, stream: str, session: str) -> dict[str, int]:
    nc = await connect(url)
    try:
        info = await api_request(
            nc, f"$JS.API.STREAM.INFO.{stream}", {"subjects_filter": f"tw.chunks.*.{session}.*"}
        )
        found: dict[str, int] = info["state"].get("subjects") or {}
        return found
    finally:
        await close_client(nc)
