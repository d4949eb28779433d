"""Same request, same bytes: content depends only on scenario, settings and request."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.scripted_provider.conftest import FIXED_CLOCK, SETTINGS
from tokenwire.services.scripted_provider import ScriptedServer, ScriptedSettings, expected_outcome

USER = [{"role": "user", "content": "hi"}]
CASES = [
    ("/v1/chat/completions", "tools", True),
    ("/v1/chat/completions", "reasoning", False),
    ("/v1/messages", "reasoning", True),
    ("/v1/messages", "max-tokens", False),
]


def body(model: str, stream: bool) -> dict[str, Any]:
    return {"model": model, "messages": USER, "stream": stream, "max_tokens": 64}


async def fetch(
    settings: ScriptedSettings,
    path: str,
    payload: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> bytes:
    async with (
        ScriptedServer(settings, clock=lambda: FIXED_CLOCK) as server,
        httpx.AsyncClient(base_url=server.url) as http,
    ):
        response = await http.post(path, json=payload, headers=headers or {})
    assert response.status_code == 200
    return response.content


@pytest.mark.parametrize(("path", "scenario", "stream"), CASES)
async def test_same_request_same_bytes_across_servers(
    path: str, scenario: str, stream: bool
) -> None:
    first = await fetch(SETTINGS, path, body(scenario, stream))
    second = await fetch(SETTINGS, path, body(scenario, stream))
    assert first == second


@pytest.mark.parametrize(
    "change",
    [
        {"settings": ScriptedSettings(seed=8, length=6, fragment_size=5)},
        {"headers": {"X-Tokenwire-Session": "other"}},
        {"messages": [*USER, {"role": "assistant", "content": "ok"}, *USER]},
    ],
)
async def test_seed_session_and_history_change_the_content(change: dict[str, Any]) -> None:
    payload = body("text", True) | (
        {"messages": change["messages"]} if "messages" in change else {}
    )
    base = await fetch(SETTINGS, "/v1/messages", body("text", True))
    changed = await fetch(
        change.get("settings", SETTINGS), "/v1/messages", payload, change.get("headers")
    )
    assert base != changed


async def test_clock_is_injected_into_created() -> None:
    raw = await fetch(SETTINGS, "/v1/chat/completions", body("text", False))
    assert json.loads(raw)["created"] == int(FIXED_CLOCK)


@pytest.mark.parametrize("scenario", ["text", "reasoning", "tools", "max-tokens", "error", "stall"])
@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
def test_sentinel_is_in_every_generated_content(scenario: str, dialect: Any) -> None:
    settings = ScriptedSettings(sentinel="CANARY", seed=42, length=3, fragment_size=2)
    step = expected_outcome(scenario, body(scenario, True), settings, dialect=dialect)
    contents = [step.text, step.reasoning, *(c.arguments for c in step.tool_calls)]
    assert [c for c in contents if c]
    assert all("CANARY-42" in c for c in contents if c)
