"""``tokenwire keys create|list|revoke|set|set-tenant`` against a real nats-server: a created
key is printed once and stored only as its hash (hashlib is the oracle), a listing never shows
a hash, changes are the ones given, a revoke deletes, and mistakes are refused with one line
and the documented exit code. The CLI uses the default names: this module runs its own
server."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.broker import close_client, own_server
from tokenwire.broker import KeyEntry, KeysBucket, Topology, connect
from tokenwire.cli import main
from tokenwire.schemas import Budget, KeyRecord, Limits, TenantRecord


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    for url in own_server(tmp_path_factory, "keys-nats"):
        assert main_provision(url) == 0
        yield url


def main_provision(url: str) -> int:
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TOKENWIRE_NATS_URL", url)
        return main(["provision"])


@pytest.fixture(autouse=True)
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, server: str) -> None:
    monkeypatch.setenv("TOKENWIRE_NATS_URL", server)
    monkeypatch.setenv("TOKENWIRE_DATA_DIR", str(tmp_path / "data"))


def stored(url: str, kind: str, name: str) -> KeyEntry | None:
    async def go() -> KeyEntry | None:
        nc = await connect(url)
        try:
            book = KeysBucket(nc, Topology().keys_bucket)
            return await book.entry("key" if kind == "key" else "tenant", name)
        finally:
            await close_client(nc)

    return asyncio.run(go())


def test_create_prints_the_key_once_and_stores_only_its_hash(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["keys", "create", "ci-1", "--tenant", "team-a", "--rpm", "60", "--models", "a,b/*"]
    assert main([*args, "--budget-usd", "2.5", "--expires-at", "2999-01-01T00:00:00Z"]) == 0
    out, err = capsys.readouterr()
    key = out.strip()
    assert key.startswith("tw-")
    assert len(key) >= 40
    assert "shown only now" in err
    held = stored(server, "key", "ci-1")
    assert held is not None
    assert held.record == KeyRecord(
        name="ci-1",
        sha256=hashlib.sha256(key.encode()).hexdigest(),
        tenant="team-a",
        expires_at="2999-01-01T00:00:00Z",
        models=["a", "b/*"],
        limits=Limits(rpm=60, budget=Budget(usd="2.5")),
    )
    assert main(["keys", "create", "ci-1"]) == 1  # the name is taken
    assert "exists" in capsys.readouterr().err


def test_list_set_and_revoke(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["keys", "create", "ci-2", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    digest = hashlib.sha256(made["key"].encode()).hexdigest()
    assert main(["keys", "set", "ci-2", "--tpm", "1000", "--rpm", "none", "--models", "m"]) == 0
    assert main(["keys", "set-tenant", "ci-2", "--concurrent", "4"]) == 0
    capsys.readouterr()
    assert main(["keys", "list"]) == 0
    listing = capsys.readouterr().out
    line = next(x for x in listing.splitlines() if x.startswith("ci-2 "))
    assert "tpm=1000" in line
    assert "rpm=" not in line
    assert digest[:8] + "..." in line
    assert digest not in listing
    assert "tenant ci-2: concurrent=4" in listing
    assert main(["keys", "list", "--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    mine = next(r["key"] for r in rows if "key" in r and r["key"]["name"] == "ci-2")
    assert mine["sha256_prefix"] == digest[:8]
    assert "sha256" not in mine
    limits = {"rpm": None, "tpm": None, "concurrent": 4, "budget": None}
    assert {"tenant": {"name": "ci-2", "limits": limits}} in rows
    tenant = stored(server, "tenant", "ci-2")
    assert tenant is not None
    assert tenant.record == TenantRecord(name="ci-2", limits=Limits(concurrent=4))

    assert main(["keys", "revoke", "ci-2"]) == 0
    gone = stored(server, "key", "ci-2")
    assert gone is not None
    assert gone.record is None
    assert main(["keys", "revoke", "ci-2"]) == 1
    assert "no key named 'ci-2'" in capsys.readouterr().err
    assert main(["keys", "create", "ci-2"]) == 0  # a revoked name may be used again


@pytest.mark.parametrize(
    ("args", "code", "why"),
    [
        (["keys", "create", "bad name"], 2, "name"),
        (["keys", "create", "x", "--rpm", "0"], 2, "--rpm must be a whole number"),
        (["keys", "create", "x", "--expires-at", "2030-01-01"], 2, "no UTC offset"),
        (["keys", "create", "x", "--budget-usd", "lots"], 2, "--budget-usd must be dollars"),
        (["keys", "create", "x", "--budget-period", "day"], 2, "--budget-period needs"),
        (["keys", "set", "nobody", "--rpm", "5"], 1, "no key named 'nobody'"),
    ],
)
def test_mistakes_are_one_line_and_change_nothing(
    server: str, capsys: pytest.CaptureFixture[str], args: list[str], code: int, why: str
) -> None:
    assert main(args) == code
    err = capsys.readouterr().err
    assert why in err
    assert stored(server, "key", "x") is None
