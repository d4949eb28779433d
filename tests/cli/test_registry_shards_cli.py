"""``tokenwire provision`` with ``TOKENWIRE_REGISTRY_SHARDS`` against a real nats-server: the
buckets it makes, and a process of another R refused at start (exit 2, one line, nothing
changed). The CLI uses the default names: this module runs its own server."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.broker import close_client, own_server
from tokenwire.broker import Topology, connect
from tokenwire.broker._layout import registry_buckets_found
from tokenwire.cli import main

FOUR = (
    "tokenwire-steps-r4-0",
    "tokenwire-steps-r4-1",
    "tokenwire-steps-r4-2",
    "tokenwire-steps-r4-3",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from own_server(tmp_path_factory, "registry-nats")


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, server: str) -> None:
    monkeypatch.setenv("TOKENWIRE_NATS_URL", server)
    monkeypatch.setenv("TOKENWIRE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("TOKENWIRE_PARTITIONS", "4")
    monkeypatch.delenv("TOKENWIRE_REGISTRY_SHARDS", raising=False)


def _found(url: str) -> list[str]:
    async def go() -> list[str]:
        nc = await connect(url)
        try:
            return await registry_buckets_found(nc, Topology())
        finally:
            await close_client(nc)

    return asyncio.run(go())


def test_provision_makes_r_buckets_and_refuses_a_process_of_another_r(
    server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert main(["provision", "--registry-shards", "4"]) == 0
    out = capsys.readouterr().out
    assert f"step registry {', '.join(FOUR)} ready" in out
    events = [f"TOKENWIRE_EVENTS_R4_{r}" for r in range(4)]
    assert f"events {', '.join(events)} ready" in out
    with monkeypatch.context() as env:
        env.setenv("TOKENWIRE_REGISTRY_SHARDS", "4")
        assert main(["status", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(s["name"], s["provisioned"]) for s in report["events"]] == [(e, True) for e in events]
    assert _found(server) == list(FOUR)

    assert main(["provision"]) == 2  # R = 1 against a deployment of R = 4
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    for named in (
        "R=1 (tokenwire-steps)",
        "R=4: tokenwire-steps-r4-0",
        "TOKENWIRE_REGISTRY_SHARDS",
    ):
        assert named in err
    assert _found(server) == list(FOUR)  # nothing created

    assert main(["provision", "--registry-shards", "4"]) == 0  # the deployment's own: again
    assert _found(server) == list(FOUR)
