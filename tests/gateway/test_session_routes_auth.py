"""The session routes (tokenwire.replay) read recorded content: they need the gateway key too."""

from __future__ import annotations

from typing import Any

import httpx

from tests.gateway._helpers import GATEWAY_KEY
from tokenwire.broker import MemoryPublisher, MemoryStepRegistry, Topology
from tokenwire.replay import events_router
from tokenwire.services.gateway import (
    CannedUpstream,
    GatewayDeps,
    GatewaySettings,
    create_app,
)
from tokenwire.store import MemoryStore


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
