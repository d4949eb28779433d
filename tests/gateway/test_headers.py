"""The headers SDKs rely on, through a real gateway (real socket, real nats-server) in front
of the scripted provider: rate-limit answers relayed, ``x-should-retry: false`` where a retry
cannot help, the provider's own id and model in non-streaming answers, forwarded headers."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from tests.gateway._helpers import GATEWAY_KEY, provider_env
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.services.scripted_provider import ScriptedServer, ScriptedSettings

SCRIPTED = ScriptedSettings(seed=3, length=5)


@pytest.fixture
async def gateway(nc, topology):
    async with ScriptedServer(SCRIPTED) as scripted:
        env = provider_env(
            TOKENWIRE_SCRIPTED_BASE_URL=scripted.url,
            TOKENWIRE_ANTHROPIC_BASE_URL=scripted.url,
        )
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


async def test_a_provider_rate_limit_reaches_the_caller_with_its_headers(gateway) -> None:
    url, _ = gateway
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=GATEWAY_KEY, max_retries=0) as oa:
        with pytest.raises(openai.RateLimitError) as info:
            await oa.chat.completions.create(
                model="scripted/http-429", messages=[{"role": "user", "content": "x"}]
            )
    headers = info.value.response.headers
    assert (headers["retry-after"], headers["retry-after-ms"]) == ("1", "1000")
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert "x-should-retry" not in headers  # a rate limit is worth retrying, after the wait
    async with anthropic.AsyncAnthropic(base_url=url, api_key=GATEWAY_KEY, max_retries=0) as an:
        with pytest.raises(anthropic.RateLimitError) as ainfo:
            await an.messages.create(
                model="scripted/http-429",
                max_tokens=10,
                messages=[{"role": "user", "content": "x"}],
            )
    assert ainfo.value.response.headers["retry-after"] == "1"


async def test_a_step_conflict_is_not_retried_by_the_sdk(gateway) -> None:
    url, scripted = gateway
    identity = {
        "x-tokenwire-session": "conflict-1",
        "x-tokenwire-turn": "0",
        "x-tokenwire-step": "0",
    }
    async with openai.AsyncOpenAI(
        base_url=url + "/v1", api_key=GATEWAY_KEY, max_retries=2, default_headers=identity
    ) as oa:
        await oa.chat.completions.create(
            model="scripted/text", messages=[{"role": "user", "content": "x"}]
        )
        sent = len(scripted.received)
        with pytest.raises(openai.ConflictError) as info:
            await oa.chat.completions.create(
                model="scripted/text", messages=[{"role": "user", "content": "another"}]
            )
    assert info.value.response.headers["x-should-retry"] == "false"
    assert len(scripted.received) == sent  # a conflict never reaches the provider
    assert info.value.response.request.headers.get("x-stainless-retry-count") == "0"


@pytest.mark.parametrize("stream", [True, False])
async def test_an_explicit_steps_failure_is_not_retried_into_a_conflict(gateway, stream) -> None:
    """A named (turn, step) is claimed before the provider call and stays claimed when the
    call fails; the SDK's default retry of a 429 would only get the recorded error again. The
    caller sees the provider's rate limit, after one provider call; the same request sent
    again gets the recorded error (502, never a 409), without a provider call."""
    url, scripted = gateway
    identity = {
        "x-tokenwire-session": f"explicit-429-{stream}",
        "x-tokenwire-turn": "0",
        "x-tokenwire-step": "0",
    }
    sent = len(scripted.received)
    async with openai.AsyncOpenAI(
        base_url=url + "/v1", api_key=GATEWAY_KEY, max_retries=2, default_headers=identity
    ) as oa:
        with pytest.raises(openai.RateLimitError) as info:
            await oa.chat.completions.create(
                model="scripted/http-429",
                messages=[{"role": "user", "content": "x"}],
                stream=stream,
            )
    headers = info.value.response.headers
    assert (headers["x-should-retry"], headers["retry-after"]) == ("false", "1")
    assert headers["x-tokenwire-step"] == "0"
    assert len(scripted.received) == sent + 1
    assert info.value.response.request.headers.get("x-stainless-retry-count") == "0"
    async with openai.AsyncOpenAI(
        base_url=url + "/v1", api_key=GATEWAY_KEY, max_retries=2, default_headers=identity
    ) as oa:
        with pytest.raises(openai.InternalServerError) as again:
            await oa.chat.completions.create(
                model="scripted/http-429",
                messages=[{"role": "user", "content": "x"}],
                stream=stream,
            )
    assert again.value.status_code == 502
    assert again.value.response.headers["x-should-retry"] == "false"
    assert "429" in again.value.message or "rate" in again.value.message.lower()
    assert len(scripted.received) == sent + 1


async def test_non_streaming_answers_carry_the_providers_id_and_model(gateway) -> None:
    url, scripted = gateway
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=GATEWAY_KEY, max_retries=0) as oa:
        completion = await oa.chat.completions.create(
            model="scripted/text", messages=[{"role": "user", "content": "x"}]
        )
    got = scripted.received[-1]
    async with httpx.AsyncClient() as direct:  # the same request straight to the provider
        response = await direct.post(scripted.url + got.path, content=got.body, headers=got.headers)
    first = next(
        json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")
    )
    assert (completion.id, completion.model) == (first["id"], first["model"])
    assert completion.model == "text"  # the provider's model, not the route scripted/text
    async with anthropic.AsyncAnthropic(base_url=url, api_key=GATEWAY_KEY, max_retries=0) as an:
        message = await an.messages.create(
            model="anthropic/text", max_tokens=20, messages=[{"role": "user", "content": "x"}]
        )
    got = scripted.received[-1]
    async with httpx.AsyncClient() as direct:
        response = await direct.post(scripted.url + got.path, content=got.body, headers=got.headers)
    start = next(
        json.loads(line[6:])
        for line in response.text.splitlines()
        if line.startswith("data: ") and "message_start" in line
    )
    assert (message.id, message.model) == (start["message"]["id"], start["message"]["model"])


async def test_anthropic_beta_is_forwarded_and_other_headers_are_not(gateway) -> None:
    url, scripted = gateway
    async with anthropic.AsyncAnthropic(base_url=url, api_key=GATEWAY_KEY, max_retries=0) as an:
        await an.messages.create(
            model="anthropic/text",
            max_tokens=20,
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"anthropic-beta": "interleaved-thinking-2025-05-14", "x-private": "1"},
        )
    got = scripted.received[-1].headers
    assert got["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    assert "x-private" not in got
    assert GATEWAY_KEY not in json.dumps(got)
