"""The session routes (tokenwire.replay) read recorded content: they need the gateway key too."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest

from tests.gateway._helpers import GATEWAY_KEY
from tokenwire.broker import BrokerUnavailable, MemoryPublisher, MemoryStepRegistry, Topology
from tokenwire.replay import events_router
from tokenwire.replay._errors import ReplayError
from tokenwire.replay._sse import error_frame
from tokenwire.services.gateway import (
    CannedUpstream,
    GatewayDeps,
    GatewaySettings,
    create_app,
)
from tokenwire.store import MemoryStore, StoreError


def _no_upstream(route: object, body: bytes) -> Any:
    raise AssertionError("the session routes never call a provider")


def _app(keys: frozenset[str]) -> Any:
    store = MemoryStore()
    router = events_router(lambda: None, Topology(), lambda: store)  # type: ignore[arg-type,return-value]  # a store provider that is never called: auth is refused first
    deps = GatewayDeps(
        upstream=CannedUpstream(_no_upstream),
        sink=MemoryPublisher(),
        steps=MemoryStepRegistry(),
        extra_routes=router.routes,
    )
    return create_app(GatewaySettings(keys=keys), deps)


async def _get(app: Any, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        return await client.get(path, headers=headers or {})


async def test_session_routes_refuse_a_caller_without_the_key() -> None:
    app = _app(frozenset({GATEWAY_KEY}))
    for path in (
        "/v1/sessions",
        "/v1/sessions/s-1/messages",
        "/v1/sessions/s-1/events",
        "/v1/sessions/s-1/usage",
        "/v1/usage",
    ):
        response = await _get(app, path)
        assert response.status_code == 401, path
        assert response.json()["error"]["type"] == "authentication_error"
        assert GATEWAY_KEY not in response.text


async def test_session_routes_answer_with_the_key_and_the_viewer_page_is_public() -> None:
    app = _app(frozenset({GATEWAY_KEY}))
    listed = await _get(app, "/v1/sessions", {"Authorization": f"Bearer {GATEWAY_KEY}"})
    assert listed.status_code == 200
    assert listed.json()["sessions"] == []
    by_header = await _get(app, "/v1/sessions", {"x-api-key": GATEWAY_KEY})
    assert by_header.status_code == 200
    viewer = await _get(app, "/viewer")
    assert viewer.status_code == 200
    assert "#key=" in viewer.text  # the page tells how to pass the key without sending it


async def test_without_keys_the_session_routes_are_open_on_loopback() -> None:
    response = await _get(_app(frozenset()), "/v1/sessions")
    assert response.status_code == 200


class FarStore(MemoryStore):
    """A store away whose error names where it lives, as the real stores' do."""

    async def sessions(self, *args: Any, **kwargs: Any) -> Any:
        raise StoreError("cannot reach postgresql://tw:***@db-SENTINEL.internal:5432/tokenwire")


def _far_broker() -> Any:
    raise BrokerUnavailable("nats://broker-SENTINEL.internal:4222", "connection closed")


async def test_the_session_routes_tell_a_broker_or_store_away_without_its_address(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A tenant's reader learns the broker or the store is away, not where either lives;
    the log has it."""
    router = events_router(_far_broker, Topology(), FarStore)
    deps = GatewayDeps(
        upstream=CannedUpstream(_no_upstream),
        sink=MemoryPublisher(),
        steps=MemoryStepRegistry(),
        extra_routes=router.routes,
    )
    app = create_app(GatewaySettings(keys=frozenset({GATEWAY_KEY})), deps)
    auth = {"authorization": f"Bearer {GATEWAY_KEY}"}
    with caplog.at_level(logging.DEBUG):
        events = await _get(app, "/v1/sessions/s1/events", auth)
        sessions = await _get(app, "/v1/sessions", auth)
    for response, what in ((events, "broker"), (sessions, "store")):
        assert response.status_code == 503
        assert what in response.json()["error"]["message"]
        assert "SENTINEL" not in response.text
    assert "broker-SENTINEL" in caplog.text
    assert "db-SENTINEL" in caplog.text


def test_a_failed_events_read_is_told_by_its_source_alone(caplog: pytest.LogCaptureFixture) -> None:
    """The ``event: error`` ending a session's events: which source failed, not where it lives
    (a replay error, which names a chunk, is told as it is)."""
    with caplog.at_level(logging.DEBUG):
        broker = error_frame(BrokerUnavailable("nats://broker-SENTINEL.internal:4222", "closed"))
        store = error_frame(StoreError("postgresql://tw:***@db-SENTINEL.internal:5432/tw"))
    assert broker == b'event: error\ndata: {"message":"the broker read failed"}\n\n'
    assert store == b'event: error\ndata: {"message":"the store read failed"}\n\n'
    assert "broker-SENTINEL" in caplog.text
    assert b"the chunk 7" in error_frame(ReplayError("the chunk 7 is not one"))
