"""The OpenAI Agents SDK (``openai-agents``) running a two-tool agent through ``/v1/responses``
of a real gateway (real socket, real nats-server), against the scripted provider in both its
dialects: Chat Completions (``openai/tools``) and Anthropic Messages (``anthropic/tools``);
through ``scripted/tools`` (which is sent the session) its two calls are one session, threaded
with no tokenwire header.
Ground truth: the scripted provider's ``expected_outcome`` for the requests it received.
The SDK is imported where it is used: every pytest worker collects this module, and only the
one that runs it pays for the SDK (ADR 0038)."""

from __future__ import annotations

import json

import openai
import pytest

from tests.gateway._helpers import GATEWAY_KEY, provider_env
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.services.scripted_provider import (
    Dialect,
    ScriptedServer,
    ScriptedSettings,
    expected_outcome,
)

SCRIPTED = ScriptedSettings(seed=21, length=5)


@pytest.fixture
async def gateway(nc, topology):
    from agents import set_tracing_disabled

    set_tracing_disabled(True)  # the SDK's tracer would export to OpenAI: no network here
    async with ScriptedServer(SCRIPTED) as scripted:
        env = provider_env(
            TOKENWIRE_ANTHROPIC_BASE_URL=scripted.url,
            TOKENWIRE_OPENAI_BASE_URL=scripted.url + "/v1",
            TOKENWIRE_SCRIPTED_BASE_URL=scripted.url,
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


@pytest.mark.parametrize("model", ["openai/tools", "anthropic/tools", "scripted/tools"])
@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
async def test_a_two_tool_agent_runs_through_responses(gateway, model: str, streamed: bool) -> None:
    from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool

    url, scripted = gateway
    calls: list[tuple[str, dict[str, str]]] = []

    @function_tool
    def get_weather(location: str, unit: str, note: str) -> str:
        """The weather at a location."""
        calls.append(("get_weather", {"location": location, "unit": unit, "note": note}))
        return f"sunny in {location}"

    @function_tool
    def get_time(location: str, unit: str, note: str) -> str:
        """The local time at a location."""
        calls.append(("get_time", {"location": location, "unit": unit, "note": note}))
        return "noon"

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=GATEWAY_KEY, max_retries=0)
    agent = Agent(
        name="assistant",
        instructions="Answer with the tools.",
        tools=[get_weather, get_time],
        model=OpenAIResponsesModel(model=model, openai_client=client),
    )
    seen = len(scripted.received)
    config = RunConfig(tracing_disabled=True)
    if streamed:
        run = Runner.run_streamed(agent, "weather and time in town?", run_config=config)
        async for _ in run.stream_events():
            pass
        final = run.final_output
    else:
        final = (
            await Runner.run(agent, "weather and time in town?", run_config=config)
        ).final_output
    await client.close()
    first, second = list(scripted.received)[seen:]  # one step with the calls, one answering
    if model.startswith("scripted/"):  # the provider that sees the session: one, unmodified
        session = first.headers["x-tokenwire-session"]
        assert second.headers["x-tokenwire-session"] == session
    dialect: Dialect = "anthropic" if first.path == "/v1/messages" else "openai"
    want_calls = expected_outcome(
        "tools", first.json(), SCRIPTED, headers=first.headers, dialect=dialect
    )
    assert calls == [(c.name, json.loads(c.arguments)) for c in want_calls.tool_calls]
    want_answer = expected_outcome(
        "tools", second.json(), SCRIPTED, headers=second.headers, dialect=dialect
    )
    assert want_answer.tool_calls == []
    assert final == want_answer.text
    tools_sent = second.json()["tools"]
    assert len(tools_sent) == 2
    if dialect == "openai":  # the tool results went back translated, one per call
        results = [m for m in second.json()["messages"] if m["role"] == "tool"]
        assert [m["tool_call_id"] for m in results] == [c.id for c in want_calls.tool_calls]
    else:
        last = second.json()["messages"][-1]["content"]
        assert [b["tool_use_id"] for b in last] == [c.id for c in want_calls.tool_calls]
