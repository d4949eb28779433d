"""``GET /v1/usage`` on the gateway: the ledger's rollups, behind the key, scoped to the caller.

The store is a real SQLite file holding a known fleet (tests/store/ledger_fleet.py); expected
rows are that fleet's lines summed here. Callers are the gateway's own named keys.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request

from tests.gateway._helpers import GATEWAY_KEY
from tests.store.ledger_fleet import expected_line, fleet, grouped, totals
from tokenwire.broker import MemoryPublisher, MemorySessionOwners, MemoryStepRegistry, Topology
from tokenwire.ledger import TOKEN_FIELDS, StepUsage, UsageTotals
from tokenwire.replay import events_router
from tokenwire.services.gateway import (
    CannedUpstream,
    GatewayDeps,
    GatewayServer,
    GatewaySettings,
    create_app,
)
from tokenwire.services.gateway._access.keys import Caller, NamedKey, key_digest
from tokenwire.services.gateway._api.usage import usage_scope
from tokenwire.store import Store, StoreError, open_store

AUTH = {"Authorization": f"Bearer {GATEWAY_KEY}"}


def _no_upstream(route: object, body: bytes) -> Any:
    raise AssertionError("the usage route never calls a provider")


def _deps(store: Store | None, owners: MemorySessionOwners | None = None) -> GatewayDeps:
    return GatewayDeps(
        upstream=CannedUpstream(_no_upstream),
        sink=MemoryPublisher(),
        steps=MemoryStepRegistry(),
        store=(lambda: store) if store is not None else None,
        owners=owners,
    )


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    await opened.commit(fleet())
    try:
        yield opened
    finally:
        await opened.close()


def lines() -> list[StepUsage]:
    return [expected_line(r) for r in fleet()]


def as_totals(row: dict[str, Any]) -> UsageTotals:
    return UsageTotals(
        steps=row["steps"],
        reported=row["reported"],
        priced=row["priced"],
        cost_pusd=row["cost_pusd"] or 0,
        **{n: row[n] for n in TOKEN_FIELDS},
    )


async def _get(app: Any, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        return await client.get(path, headers=headers if headers is not None else AUTH)


async def test_grouped_rows_equal_the_lines_and_match_the_cli_shape(store: Store) -> None:
    app = create_app(GatewaySettings(keys=frozenset({GATEWAY_KEY})), _deps(store))
    response = await _get(app, "/v1/usage")
    assert response.status_code == 200
    doc = response.json()
    assert doc["by"] == "model"
    by_model = grouped(lines(), lambda li: f"{li.provider}/{li.model}")
    assert {r["model"]: as_totals(r) for r in doc["rows"]} == by_model
    assert as_totals(doc["total"]) == totals(lines())
    late = await _get(app, "/v1/usage?by=day&since=2026-01-06")
    assert [r["day"] for r in late.json()["rows"]] == ["2026-01-06"]
    acme = await _get(app, "/v1/usage?by=key&tenant=acme")
    assert [r["key"] for r in acme.json()["rows"]] == ["ci"]


@pytest.mark.parametrize(
    ("query", "param"),
    [("by=colour", "by"), ("since=yesterday", "since"), ("since=0d", "since")],
)
async def test_bad_parameters_are_400_in_openais_shape(store: Store, query: str, param) -> None:
    app = create_app(GatewaySettings(keys=frozenset({GATEWAY_KEY})), _deps(store))
    response = await _get(app, f"/v1/usage?{query}")
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", param)


async def test_the_key_is_required_and_no_store_is_503(store: Store) -> None:
    app = create_app(GatewaySettings(keys=frozenset({GATEWAY_KEY})), _deps(store))
    refused = await _get(app, "/v1/usage", headers={})
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"
    storeless = create_app(GatewaySettings(), _deps(None))
    assert (await _get(storeless, "/v1/usage")).status_code == 503


KEY_ACME, KEY_ROOT, KEY_SOLO = "tw-acme-key", "tw-root-key", "tw-solo-key"
NAMED = (
    NamedKey(key_digest(KEY_ACME), Caller("ci", "acme", operator=False)),
    NamedKey(key_digest(KEY_ROOT), Caller("root", None, operator=True)),
    NamedKey(key_digest(KEY_SOLO), Caller("solo", "solo", operator=False)),
)


async def test_a_tenant_caller_reads_only_its_tenant(store: Store) -> None:
    app = create_app(GatewaySettings(named_keys=NAMED), _deps(store, owners=MemorySessionOwners()))

    async def get(key: str, path: str) -> Any:
        return (await _get(app, path, headers={"Authorization": f"Bearer {key}"})).json()

    mine = await get(KEY_ACME, "/v1/usage?by=session")
    assert {r["session"] for r in mine["rows"]} == {"a"}
    assert as_totals(mine["total"]) == totals([li for li in lines() if li.tenant == "acme"])
    assert mine["tenant"] == "acme"
    other = await get(KEY_ACME, "/v1/usage?tenant=beta")
    assert (other["rows"], other["total"]["steps"]) == ([], 0)  # as a tenant without usage
    assert as_totals((await get(KEY_ROOT, "/v1/usage"))["total"]) == totals(lines())
    beta = await get(KEY_ROOT, "/v1/usage?tenant=beta")
    assert as_totals(beta["total"]) == totals([li for li in lines() if li.tenant == "beta"])
    # A tenant the fleet has no line of reads nothing, never every tenant.
    alone = await get(KEY_SOLO, "/v1/usage")
    assert (alone["rows"], alone["total"]["steps"]) == ([], 0)


def _request(state: dict[str, Any]) -> Request:
    return Request({"type": "http", "method": "GET", "path": "/", "headers": [], "state": state})


def test_usage_scope_never_widens_a_caller_that_is_not_an_operator() -> None:
    assert usage_scope(_request({})) is None  # no named keys: the local operator
    assert usage_scope(_request({"caller": Caller("k", "acme", operator=False)})) == "acme"
    assert usage_scope(_request({"caller": Caller("k", None, operator=False)})) == ""
    assert usage_scope(_request({"caller": Caller("k", "acme", operator=True)})) is None


async def test_over_a_real_socket(store: Store) -> None:
    settings = GatewaySettings(port=0, keys=frozenset({GATEWAY_KEY}))
    async with (
        GatewayServer(settings, _deps(store)) as server,
        httpx.AsyncClient(base_url=server.url, headers=AUTH) as client,
    ):
        response = await client.get("/v1/usage", params={"by": "tenant"})
    assert response.status_code == 200
    expected = grouped(lines(), lambda li: li.tenant)
    assert {r["tenant"]: as_totals(r) for r in response.json()["rows"]} == expected


async def test_a_sessions_usage_route_lists_its_steps(store: Store) -> None:
    router = events_router(lambda: None, Topology(), lambda: store)  # type: ignore[arg-type,return-value]  # the broker is never asked
    deps = dataclasses.replace(_deps(store), extra_routes=router.routes)
    app = create_app(GatewaySettings(), deps)
    doc = (await _get(app, "/v1/sessions/a/usage")).json()
    expected = [li for li in lines() if li.session == "a"]
    assert [(s["turn"], s["step"], s["cost_pusd"]) for s in doc["steps"]] == [
        (li.turn, li.step, li.cost_pusd) for li in expected
    ]
    assert as_totals(doc["total"]) == totals(expected)
    assert (await _get(app, "/v1/sessions/nobody/usage")).status_code == 404
    assert (await _get(app, "/v1/sessions/bad%20id/usage")).status_code == 400


class FarStore:
    """A store away whose error names where it lives, as the real stores' do."""

    async def usage(self, *args: Any) -> Any:
        raise StoreError("cannot reach postgresql://tw:***@db-SENTINEL.internal:5432/tokenwire")


async def test_a_store_away_is_503_without_its_address(caplog: pytest.LogCaptureFixture) -> None:
    app = create_app(GatewaySettings(keys=frozenset({GATEWAY_KEY})), _deps(FarStore()))  # type: ignore[arg-type]  # a store twin with the one method the route calls
    with caplog.at_level(logging.DEBUG):
        response = await _get(app, "/v1/usage")
    assert response.status_code == 503
    assert response.json()["error"]["message"] == "store not available"
    assert "db-SENTINEL" in caplog.text  # the log has it
