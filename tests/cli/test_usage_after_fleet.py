"""Done-when of the ledger: after the demo fleet, ``tokenwire usage --by model`` equals the sum
of the usage the scripted provider sent, and equals it again after ``tokenwire rebuild`` from
the broker into an empty store, on SQLite and on PostgreSQL.

Real parts: a nats-server, the scripted provider and the gateway on sockets, the demo fleet
(``run_fleet``, the official openai SDK), the assembler, a SQLite file or a PostgreSQL schema,
and the CLI (``tokenwire.cli.main``). The oracle is the scripted provider's own script
(``expected_outcome``) for each request it received: what it streamed, never our store.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.fixtures.broker import close_client
from tests.fixtures.stores import with_search_path
from tests.gateway._helpers import provider_env
from tokenwire.broker import EmbeddedServer, Topology, connect, ensure_topology
from tokenwire.cli import main
from tokenwire.cli._fleet import FleetPlan, run_fleet
from tokenwire.ledger import TOKEN_FIELDS
from tokenwire.services.assembler import AssemblerSettings, run
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.services.scripted_provider import (
    ScriptedServer,
    ScriptedSettings,
    expected_outcome,
)
from tokenwire.services.scripted_provider._app import ReceivedRequest

PARTITIONS = 4
SETTINGS = ScriptedSettings(seed=5)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A nats-server with the default topology (the CLI's), for this module alone."""
    nats = EmbeddedServer(tmp_path_factory.mktemp("fleet-nats")).start()
    try:
        asyncio.run(_provision(nats.url))
        yield nats.url
    finally:
        nats.stop()


async def _provision(url: str) -> None:
    nc = await connect(url)
    try:
        await ensure_topology(nc, Topology(partitions=PARTITIONS))
    finally:
        await close_client(nc)


@contextlib.contextmanager
def _pg_schema(base: str) -> Iterator[str]:
    schema = f"tw_test_{secrets.token_hex(6)}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield with_search_path(base, schema)
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def two_stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Two empty stores of one kind: the assembler's, and the one rebuild fills."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'assembled.db'}", f"sqlite:///{tmp_path / 'rebuilt.db'}"
        return
    base = request.getfixturevalue("pg_server")
    with _pg_schema(base) as assembled, _pg_schema(base) as rebuilt:
        yield assembled, rebuilt


async def _fleet(url: str, store_url: str, plan: FleetPlan) -> list[ReceivedRequest]:
    """The demo fleet through the gateway to the scripted provider, then the assembler (burst)
    drains the stream into ``store_url``. Returns what the scripted provider received."""
    topology = Topology(partitions=PARTITIONS)
    nc = await connect(url)
    try:
        async with ScriptedServer(SETTINGS) as scripted:
            real = await broker_deps(nc, topology)
            gateway = GatewaySettings(
                port=0,
                partitions=PARTITIONS,
                ack_timeout_s=10.0,
                provider_env=provider_env(TOKENWIRE_SCRIPTED_BASE_URL=scripted.url),
            )
            try:
                async with GatewayServer(gateway, real.deps) as served:
                    result = await run_fleet(plan, served.url)
            finally:
                await real.aclose()
            received = list(scripted.received)
        assert result.unexpected_failures == 0, result.failures
        settings = AssemblerSettings(
            nats_urls=(url,),
            store_url=store_url,
            topology=topology,
            burst=True,
            metrics_addr=None,
            provision=False,
            tune_gc=False,
        )
        await run(settings)
    finally:
        await close_client(nc)
    return received


def _served(received: list[ReceivedRequest], sessions: set[str]) -> dict[str, Counter[str]]:
    """The oracle: per ``scripted/<scenario>``, the steps and the usage the provider sent."""
    by_model: dict[str, Counter[str]] = {}
    for request in received:
        body = request.json()
        headers = {k.lower(): v for k, v in request.headers.items()}
        if headers.get("x-tokenwire-session") not in sessions:
            continue
        scenario = str(body["model"]).removeprefix("scripted/")
        sent = expected_outcome(scenario, body, SETTINGS, headers=headers)
        sums = by_model.setdefault(f"scripted/{scenario}", Counter())
        sums["steps"] += 1
        if sent.usage is not None:
            sums["reported"] += 1
            for name in TOKEN_FIELDS:
                sums[name] += getattr(sent.usage, name) or 0
    return by_model


def _usage_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["usage", *argv, "--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def _as_counts(doc: dict[str, Any]) -> dict[str, Counter[str]]:
    keys = ("steps", "reported", *TOKEN_FIELDS)
    return {row["model"]: Counter({k: row[k] for k in keys if row[k]}) for row in doc["rows"]}


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_usage_by_model_equals_what_the_provider_sent_before_and_after_rebuild(
    server: str,
    two_stores: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assembled, rebuilt = two_stores
    plan = FleetPlan(sessions=3, turns=2, steps=3, run_id=uuid.uuid4().hex[:8])
    sessions = {plan.session_id(k) for k in range(plan.sessions)}
    received = asyncio.run(_fleet(server, assembled, plan))
    served = _served(received, sessions)
    assert sum(c["steps"] for c in served.values()) == plan.sessions * plan.turns * plan.steps
    assert sum(c["reported"] for c in served.values()) > 0

    for name in ("TOKENWIRE_DATA_DIR", "TOKENWIRE_CONNECT_TIMEOUT_S"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TOKENWIRE_NATS_URL", server)
    monkeypatch.setenv("TOKENWIRE_PARTITIONS", str(PARTITIONS))
    monkeypatch.setenv("TOKENWIRE_STORE", assembled)
    before = {by: _usage_json(capsys, "--by", by) for by in ("model", "session", "day", "tenant")}
    assert _as_counts(before["model"]) == served
    assert {r["session"] for r in before["session"]["rows"]} == sessions
    # the scripted provider has no list price: every step unpriced, with the reason
    assert before["model"]["total"]["cost_usd"] is None
    assert before["model"]["total"]["unpriced"] == before["model"]["total"]["steps"]
    assert [r["tenant"] for r in before["tenant"]["rows"]] == [None]  # no named keys

    monkeypatch.setenv("TOKENWIRE_STORE", rebuilt)
    assert main(["rebuild", *(f"--session={s}" for s in sorted(sessions))]) == 0
    after = {by: _usage_json(capsys, "--by", by) for by in ("model", "session", "day", "tenant")}
    assert _as_counts(after["model"]) == served
    assert after == before  # every grouping, the UTC days included
    step = _usage_json(capsys, "--session", sorted(sessions)[0])["steps"][0]
    assert step["cost_reason"] == f"no price for {step['provider']}/{step['model']}: " + (
        "'scripted' has no list price"
    )
