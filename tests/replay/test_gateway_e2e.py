"""Replay equals what the gateway's caller received: the real gateway on a socket, in front of
the scripted provider on a socket, publishing to a real nats-server; the caller is the
official OpenAI SDK, whose own stream accumulation is the oracle."""

from __future__ import annotations

import uuid

import openai
import pytest

from tests.gateway._helpers import GATEWAY_KEY, provider_env
from tests.replay.sessions import seen
from tokenwire.replay import read_session
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.services.scripted_provider import ScriptedServer, ScriptedSettings


@pytest.fixture
async def gateway_url(nc, topology):
    async with ScriptedServer(ScriptedSettings(seed=7, length=24)) as scripted:
        real = await broker_deps(nc, topology)
        settings = GatewaySettings(
            port=0,
            keys=frozenset({GATEWAY_KEY}),
            provider_env=provider_env(TOKENWIRE_SCRIPTED_BASE_URL=scripted.url),
            partitions=topology.partitions,
            ack_timeout_s=10.0,
        )
        try:
            async with GatewayServer(settings, real.deps) as server:
                yield server.url
        finally:
            await real.aclose()


async def call(url: str, session: str, scenario: str) -> tuple[str, list[tuple[str, str]]]:
    """Stream one completion; return the text and the tool calls the caller assembled."""
    client = openai.AsyncOpenAI(
        base_url=f"{url}/v1",
        api_key=GATEWAY_KEY,
        max_retries=0,
        default_headers={"X-Tokenwire-Session": session},
    )
    text = ""
    calls: dict[int, tuple[str, str]] = {}
    try:
        stream = await client.chat.completions.create(
            model=f"scripted/{scenario}",
            stream=True,
            messages=[{"role": "user", "content": f"hello {scenario}"}],
        )
        async for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                for call in choice.delta.tool_calls or []:
                    name, args = calls.get(call.index, ("", ""))
                    fn = call.function
                    calls[call.index] = (
                        name + (fn.name or "") if fn else name,
                        args + (fn.arguments or "") if fn else args,
                    )
    finally:
        await client.close()
    return text, [calls[i] for i in sorted(calls)]


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["text", "tools"])
async def test_replay_equals_what_the_gateway_caller_received(nc, topology, gateway_url, scenario):
    session = f"g-{uuid.uuid4().hex[:10]}"
    text, calls = await call(gateway_url, session, scenario)

    got = seen([e async for e in read_session(nc, topology, session)])

    assert text or calls, "the caller received nothing"
    assert bool(calls) == (scenario == "tools")
    assert "".join(got.text.values()) == text
    replayed = [(c.name, c.arguments) for step in got.calls.values() for c in step]
    assert replayed == calls
