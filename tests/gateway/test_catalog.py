"""``GET /v1/models``, ``POST /v1/messages/count_tokens`` and ``GET /openapi.json`` on a real
gateway (real socket, real nats-server) in front of the scripted provider, which also stands in
for Anthropic and OpenAI through their base-URL variables."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pytest

from tests.gateway._helpers import GATEWAY_KEY, OPENAI_KEY
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.services.gateway._api.catalog import ModelCatalog
from tokenwire.services.scripted_provider import ScriptedServer, ScriptedSettings
from tokenwire.services.scripted_provider._script import SCENARIOS

LISTED = [s for s in SCENARIOS if s != "recording"]


@pytest.fixture
async def gateway(nc, topology):
    async with ScriptedServer(ScriptedSettings(seed=2, length=4)) as scripted:
        env = {
            "TOKENWIRE_SCRIPTED_BASE_URL": scripted.url,
            "ANTHROPIC_API_KEY": "sk-ant-test-key",
            "TOKENWIRE_ANTHROPIC_BASE_URL": scripted.url,
            "OPENAI_API_KEY": OPENAI_KEY,
            "TOKENWIRE_OPENAI_BASE_URL": "http://127.0.0.1:9/v1",  # nothing listens there
            "TOKENWIRE_OPENAI_RESPONSES_BASE_URL": "http://127.0.0.1:9/v1",
        }
        real = await broker_deps(nc, topology)
        settings = GatewaySettings(
            port=0,
            keys=frozenset({GATEWAY_KEY}),
            provider_env=env,
            partitions=topology.partitions,
            ack_timeout_s=10.0,
        )
        try:
            async with GatewayServer(settings, real.deps) as server:
                yield server.url, scripted
        finally:
            await real.aclose()


async def test_models_lists_every_configured_provider(gateway) -> None:
    url, _ = gateway
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=GATEWAY_KEY, max_retries=0) as oa:
        page = await oa.models.list()
        ids = [m.id for m in page.data]
        raw = await oa.models.with_raw_response.list()
    assert ids == [f"scripted/{s}" for s in LISTED] + [
        f"anthropic/{s}" for s in LISTED
    ]  # table order
    assert {m.owned_by for m in page.data} == {"scripted", "anthropic"}
    providers = raw.http_response.json()["providers"]
    assert [(p["name"], p["listed"]) for p in providers] == [
        ("scripted", True),
        ("openai", False),  # configured but unreachable: reported, not silently left out
        ("openai-responses", False),
        ("anthropic", True),
    ]
    assert OPENAI_KEY not in raw.http_response.text
    async with httpx.AsyncClient() as client:
        refused = await client.get(url + "/v1/models")
    assert refused.status_code == 401


async def test_models_are_cached_per_provider() -> None:
    async with ScriptedServer(ScriptedSettings()) as scripted:
        now = [0.0]
        catalog = ModelCatalog(
            {"TOKENWIRE_SCRIPTED_BASE_URL": scripted.url}, lambda: now[0], ttl_s=60.0
        )
        first = await catalog.listing()
        seen = len(scripted.received)
        assert await catalog.listing() == first
        assert catalog.fetches == 1
        now[0] = 61.0
        assert await catalog.listing() == first
        assert catalog.fetches == 2
        assert len(scripted.received) == seen  # GETs are not recorded, only model calls
        assert len(catalog._cache) == 1


async def test_count_tokens_is_forwarded_to_anthropic_routes(gateway) -> None:
    url, scripted = gateway
    async with anthropic.AsyncAnthropic(base_url=url, api_key=GATEWAY_KEY, max_retries=0) as an:
        counted = await an.messages.count_tokens(
            model="anthropic/text",
            messages=[
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"},
            ],
            extra_headers={"anthropic-beta": "token-counting-2024-11-01"},
        )
        message = await an.messages.create(
            model="anthropic/text", max_tokens=10, messages=[{"role": "user", "content": "a"}]
        )
    got = [r for r in scripted.received if r.path == "/v1/messages/count_tokens"][-1]
    assert got.json()["model"] == "text"
    assert got.headers["x-api-key"] == "sk-ant-test-key"
    assert got.headers["anthropic-beta"] == "token-counting-2024-11-01"
    # the provider's own count: three messages count three times one
    assert counted.input_tokens == 3 * message.usage.input_tokens


async def test_count_tokens_elsewhere_is_a_clear_400(gateway) -> None:
    url, _ = gateway
    async with anthropic.AsyncAnthropic(base_url=url, api_key=GATEWAY_KEY, max_retries=0) as an:
        with pytest.raises(anthropic.BadRequestError) as info:
            await an.messages.count_tokens(
                model="openai/gpt-4o", messages=[{"role": "user", "content": "a"}]
            )
    assert "only for Anthropic routes" in info.value.message
    assert "openai/gpt-4o" in info.value.message
    assert info.value.response.headers["x-should-retry"] == "false"


async def test_openapi_describes_every_route(gateway) -> None:
    url, _ = gateway
    async with httpx.AsyncClient() as client:
        doc = (await client.get(url + "/openapi.json")).json()
    assert doc["openapi"] == "3.1.0"
    served = {
        "/v1/chat/completions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/models",
        "/openapi.json",
        "/healthz",
        "/readyz",
        "/metrics",
    }
    assert served <= set(doc["paths"])
    params = {p["name"] for p in doc["paths"]["/v1/chat/completions"]["post"]["parameters"]}
    assert {"x-tokenwire-session", "x-tokenwire-drop-params"} <= params
