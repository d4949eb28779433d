"""The gateway on a real socket, publishing to a real nats-server, in front of the scripted
provider on a real socket. Ground truth: the scripted provider's ``expected_outcome``.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.types import MessageParam, ToolUnionParam
from nats.aio.client import Client
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolUnionParam

from tests.gateway._helpers import ANTHROPIC_KEY, GATEWAY_KEY, OPENAI_KEY, provider_env
from tokenwire.broker import Topology
from tokenwire.fold import fold
from tokenwire.schemas import ChunkEnvelope, Finish, Message, ReasoningBlock, chunk_envelopes
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.services.scripted_provider import (
    Dialect,
    ScriptedServer,
    ScriptedSettings,
    expected_outcome,
)

SCRIPTED = ScriptedSettings(seed=11, length=12, sentinel="CONTENT")
AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}


@dataclass
class Stack:
    url: str
    nc: Client
    topology: Topology
    server: GatewayServer


@pytest.fixture
async def scripted():
    async with ScriptedServer(SCRIPTED) as server:
        yield server


@pytest.fixture
async def stack(nc, topology, scripted):
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
            yield Stack(server.url, nc, topology, server)
    finally:
        await real.aclose()


@dataclass
class Stored:
    subject: str
    headers: dict[str, str]
    payload: bytes

    @property
    def envelopes(self) -> list[ChunkEnvelope]:
        """The chunks the message carries (one, or a frame's)."""
        return chunk_envelopes(self.payload)

    @property
    def envelope(self) -> ChunkEnvelope:
        """The message's first chunk."""
        return self.envelopes[0]


async def read_stream(nc: Client, topology: Topology) -> list[Stored]:
    """Every message of the chunk stream, in stream order (an ordered consumer)."""
    js = nc.jetstream()
    total = (await js.stream_info(topology.stream)).state.messages
    out: list[Stored] = []
    if total == 0:
        return out
    sub = await js.subscribe(
        f"{topology.prefix}.chunks.>", ordered_consumer=True, stream=topology.stream
    )
    try:
        while len(out) < total:
            msg = await sub.next_msg(timeout=5)
            out.append(Stored(msg.subject, dict(msg.headers or {}), msg.data))
    finally:
        await sub.unsubscribe()
    return out


def by_session(stored: list[Stored]) -> dict[str, list[ChunkEnvelope]]:
    sessions: dict[str, list[ChunkEnvelope]] = {}
    for s in stored:
        for env in s.envelopes:
            sessions.setdefault(env.session, []).append(env)
    return sessions


def sent_body(dialect: str, scenario: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """What the gateway forwards to the scripted provider for a same-dialect request."""
    if dialect == "openai":
        return {
            "model": scenario,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    return {"model": scenario, "messages": messages, "max_tokens": 100, "stream": True}


def expected(dialect: Dialect, scenario: str, session: str, messages: list[dict[str, Any]]):
    body = sent_body(dialect, scenario, messages)
    headers = {"X-Tokenwire-Session": session}
    return expected_outcome(scenario, body, SCRIPTED, headers=headers, dialect=dialect)


async def one_session(client: httpx.AsyncClient, i: int) -> tuple[Any, ...]:
    dialect = "openai" if i % 2 == 0 else "anthropic"
    scenario = ("text", "reasoning", "tools")[i % 3]
    session = f"sess-{i:03d}"
    messages = [{"role": "user", "content": f"hello {i}"}]
    path = "/v1/chat/completions" if dialect == "openai" else "/v1/messages"
    body: dict[str, Any] = {"model": f"scripted/{scenario}", "messages": messages, "stream": True}
    if dialect == "anthropic":
        body["max_tokens"] = 100
    headers = {**AUTH, "x-tokenwire-session": session}
    async with client.stream("POST", path, json=body, headers=headers) as response:
        await response.aread()
    return dialect, scenario, session, response.status_code, messages


@pytest.mark.slow
async def test_fifty_concurrent_sessions_arrive_complete_in_order_exactly_once(stack):
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
        results = await asyncio.gather(*(one_session(client, i) for i in range(50)))
    sessions = by_session(await read_stream(stack.nc, stack.topology))
    assert set(sessions) == {r[2] for r in results}
    for dialect, scenario, session, status, messages in results:
        assert status == 200
        envs = sessions[session]
        assert [e.ordinal for e in envs] == list(range(len(envs))), session  # once, in order
        assert {(e.turn, e.step, e.provider, e.model) for e in envs} == {
            (0, 0, "scripted", scenario)
        }
        want = expected(dialect, scenario, session, messages)
        got = fold([e.chunk for e in envs])
        assert isinstance(got, Message)
        assert got.text == want.text, session
        assert got.tool_calls == want.tool_calls, session
        assert got.finish_reason == want.finish_reason, session
        assert got.usage == want.usage, session
        reasoning = "".join(b.text for b in got.content if type(b) is ReasoningBlock)
        assert reasoning == want.reasoning


async def test_openai_sdk_streams_and_completes_through_the_gateway(stack):
    async with openai.AsyncOpenAI(
        base_url=stack.url + "/v1", api_key=GATEWAY_KEY, max_retries=0
    ) as client:
        await _openai_sdk_checks(client, stack)


async def _openai_sdk_checks(client, stack):
    messages = [{"role": "user", "content": "weather?"}]
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ]
    session = "sdk-openai"
    async with client.chat.completions.stream(
        model="scripted/tools",
        messages=messages,
        tools=tools,
        extra_headers={"X-Tokenwire-Session": session},
    ) as stream:
        final = await stream.get_final_completion()
    body = {**sent_body("openai", "tools", messages), "tools": tools}
    headers = {"X-Tokenwire-Session": session}
    want = expected_outcome("tools", body, SCRIPTED, headers=headers, dialect="openai")
    calls = final.choices[0].message.tool_calls
    assert [(c.id, c.function.name, c.function.arguments) for c in calls] == [
        (c.id, c.name, c.arguments) for c in want.tool_calls
    ]
    assert final.choices[0].finish_reason == "tool_calls"
    completion = await client.chat.completions.create(
        model="scripted/text", messages=messages, extra_headers={"X-Tokenwire-Session": session}
    )
    want_text = expected("openai", "text", session, messages)
    assert completion.choices[0].message.content == want_text.text
    turns = {e.turn for e in by_session(await read_stream(stack.nc, stack.topology))[session]}
    assert turns == {0, 1}  # two user-ended requests: two turns


async def test_anthropic_sdk_streams_and_completes_through_the_gateway(stack):
    async with anthropic.AsyncAnthropic(
        base_url=stack.url, api_key=GATEWAY_KEY, max_retries=0
    ) as client:
        await _anthropic_sdk_checks(client)


async def _anthropic_sdk_checks(client):
    messages = [{"role": "user", "content": "weather?"}]
    tools = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    session = "sdk-anthropic"
    async with client.messages.stream(
        model="scripted/tools",
        max_tokens=100,
        messages=messages,
        tools=tools,
        extra_headers={"X-Tokenwire-Session": session},
    ) as stream:
        final = await stream.get_final_message()
    body = {**sent_body("anthropic", "tools", messages), "tools": tools}
    want = expected_outcome(
        "tools", body, SCRIPTED, headers={"X-Tokenwire-Session": session}, dialect="anthropic"
    )
    uses = [(b.id, b.name, b.input) for b in final.content if b.type == "tool_use"]
    assert uses == [(c.id, c.name, json.loads(c.arguments)) for c in want.tool_calls]
    assert final.stop_reason == "tool_use"
    message = await client.messages.create(
        model="scripted/text",
        max_tokens=100,
        messages=messages,
        extra_headers={"X-Tokenwire-Session": session},
    )
    want_text = expected("anthropic", "text", session, messages)
    assert "".join(b.text for b in message.content if b.type == "text") == want_text.text


async def test_both_sdks_share_one_session_with_unique_steps(stack):
    """Each SDK's request ends with a user message: two turns of one session."""
    hdr = {"X-Tokenwire-Session": "mixed"}
    oa_msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    an_msgs: list[MessageParam] = [{"role": "user", "content": "hi"}]
    async with openai.AsyncOpenAI(
        base_url=stack.url + "/v1", api_key=GATEWAY_KEY, max_retries=0
    ) as oa:
        await oa.chat.completions.create(model="scripted/text", messages=oa_msgs, extra_headers=hdr)
    async with anthropic.AsyncAnthropic(
        base_url=stack.url, api_key=GATEWAY_KEY, max_retries=0
    ) as an:
        await an.messages.create(
            model="scripted/text", max_tokens=10, messages=an_msgs, extra_headers=hdr
        )
    envs = by_session(await read_stream(stack.nc, stack.topology))["mixed"]
    assert sorted({(e.turn, e.step) for e in envs}) == [(0, 0), (1, 0)]


BAD = [
    ("/v1/chat/completions", b"{nope", {}),
    (
        "/v1/chat/completions",
        json.dumps({"model": "nope/x", "messages": [{"role": "user", "content": "x"}]}).encode(),
        {},
    ),
    (
        "/v1/messages",
        json.dumps({"model": "scripted/text", "messages": [], "max_tokens": 1}).encode(),
        {},
    ),
    (
        "/v1/messages",
        json.dumps(
            {
                "model": "scripted/text",
                "messages": [{"role": "user", "content": "x"}],
                "max_tokens": 1,
            }
        ).encode(),
        {"x-tokenwire-session": "bad id!"},
    ),
    ("/v1/chat/completions", b"{}", {"authorization": f"Bearer {OPENAI_KEY}"}),
]


async def test_bad_input_over_a_socket_publishes_nothing_and_leaks_nothing(stack):
    async with httpx.AsyncClient(base_url=stack.url) as client:
        for path, body, headers in BAD:
            sent = {**AUTH, "content-type": "application/json", **headers}
            response = await client.post(path, content=body, headers=sent)
            assert 400 <= response.status_code < 500, (path, body, response.text)
            if path == "/v1/messages":
                assert response.json()["type"] == "error"
            else:
                assert set(response.json()["error"]) == {"message", "type", "param", "code"}
            for secret in (GATEWAY_KEY, OPENAI_KEY, ANTHROPIC_KEY):
                assert secret not in response.text
                assert secret not in str(response.headers)
    assert await read_stream(stack.nc, stack.topology) == []


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
async def test_provider_http_error_and_dropped_stream_are_recorded(stack, dialect):
    path = "/v1/chat/completions" if dialect == "openai" else "/v1/messages"
    base = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 10, "stream": True}
    async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
        r429 = await client.post(
            path,
            json={**base, "model": "scripted/http-429"},
            headers={**AUTH, "x-tokenwire-session": "e429"},
        )
        rdrop = await client.post(
            path,
            json={**base, "model": "scripted/drop"},
            headers={**AUTH, "x-tokenwire-session": "edrop"},
        )
    assert r429.status_code == 429
    assert rdrop.status_code == 200
    tail = rdrop.text.strip().split("\n\n")[-1]
    assert "error" in tail
    assert "[DONE]" not in rdrop.text
    assert "message_stop" not in rdrop.text
    sessions = by_session(await read_stream(stack.nc, stack.topology))
    [only] = sessions["e429"]
    assert isinstance(only.chunk, Finish)
    assert only.chunk.reason == "error"
    assert only.ordinal == 0
    last = sessions["edrop"][-1].chunk
    assert isinstance(last, Finish)
    assert last.reason == "error"
    assert [e.ordinal for e in sessions["edrop"]] == list(range(len(sessions["edrop"])))


async def test_trace_context_and_no_credentials_on_the_broker(stack):
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with httpx.AsyncClient(base_url=stack.url) as client:
        body = {"model": "scripted/text", "messages": [{"role": "user", "content": "x"}]}
        await client.post(
            "/v1/chat/completions",
            json=body,
            headers={**AUTH, "traceparent": traceparent, "x-tokenwire-session": "traced"},
        )
        await client.post(
            "/v1/chat/completions", json=body, headers={**AUTH, "x-tokenwire-session": "fresh"}
        )
        metrics = (await client.get("/metrics")).text
        ready = await client.get("/readyz")
        health = await client.get("/healthz")
    stored = await read_stream(stack.nc, stack.topology)
    traced = [s for s in stored if s.envelope.session == "traced"]
    assert len(traced) > 1
    assert traced[0].envelope.ordinal == 0  # the context rides on each step's first chunk only
    assert traced[0].headers["traceparent"].split("-")[1] == "0af7651916cd43dd8448eb211c80319c"
    assert all("traceparent" not in s.headers for s in traced[1:])
    assert all(set(s.headers) == {"Nats-Msg-Id"} for s in traced[1:])
    fresh = [s for s in stored if s.envelope.session == "fresh"]
    assert fresh[0].envelope.ordinal == 0
    assert fresh[0].headers["traceparent"].split("-")[1] not in (
        "0" * 32,
        "0af7651916cd43dd8448eb211c80319c",
    )
    assert all("traceparent" not in s.headers for s in fresh[1:])
    for s in stored:
        blob = s.payload.decode() + json.dumps(s.headers)
        for secret in (GATEWAY_KEY, OPENAI_KEY, ANTHROPIC_KEY):
            assert secret not in blob
    assert ready.status_code == 200
    assert health.status_code == 200
    assert (
        'tokenwire_gateway_requests_total{route="/v1/chat/completions",status="200"} 2.0' in metrics
    )
    assert "tokenwire_gateway_time_to_first_chunk_seconds_count" in metrics
    assert 'tokenwire_gateway_steps_total{finish_reason="stop"} 2.0' in metrics


async def wait_for_finish(
    stack: Stack, session: str, timeout_s: float = 10.0
) -> list[ChunkEnvelope]:
    """The session's envelopes once its finish is stored (bounded wait)."""
    async with asyncio.timeout(timeout_s):
        while True:
            envs = by_session(await read_stream(stack.nc, stack.topology)).get(session, [])
            if envs and isinstance(envs[-1].chunk, Finish):
                return envs
            await asyncio.sleep(0.05)


async def leave_early(stack: Stack, session: str) -> None:
    body = {
        "model": "scripted/text?rate=200&fragments=60",
        "messages": [{"role": "user", "content": "x"}],
        "stream": True,
    }
    async with httpx.AsyncClient(base_url=stack.url) as client:
        headers = {**AUTH, "x-tokenwire-session": session}
        async with client.stream(
            "POST", "/v1/chat/completions", json=body, headers=headers
        ) as response:
            async for _ in response.aiter_bytes():
                break  # the caller goes away after the first bytes


async def test_the_step_is_read_to_the_end_after_the_caller_left(stack):
    await leave_early(stack, "gone")
    envs = await wait_for_finish(stack, "gone")
    assert isinstance(envs[-1].chunk, Finish)
    assert envs[-1].chunk.reason == "stop"
    assert [e.ordinal for e in envs] == list(range(len(envs)))
    body = {
        "model": "text?rate=200&fragments=60",
        "messages": [{"role": "user", "content": "x"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    want = expected_outcome("text", body, SCRIPTED, headers={"X-Tokenwire-Session": "gone"})
    got = fold([e.chunk for e in envs])
    assert isinstance(got, Message)
    assert got.text == want.text


@pytest.fixture
async def stopping_stack(nc, topology, scripted):
    real = await broker_deps(nc, topology)
    settings = GatewaySettings(
        port=0,
        keys=frozenset({GATEWAY_KEY}),
        continue_on_disconnect=False,
        provider_env=provider_env(TOKENWIRE_SCRIPTED_BASE_URL=scripted.url),
        ack_timeout_s=10.0,
    )
    try:
        async with GatewayServer(settings, real.deps) as server:
            yield Stack(server.url, nc, topology, server)
    finally:
        await real.aclose()


async def test_without_continue_on_disconnect_the_step_is_recorded_aborted(stopping_stack):
    await leave_early(stopping_stack, "stopped")
    envs = await wait_for_finish(stopping_stack, "stopped")
    assert isinstance(envs[-1].chunk, Finish)
    assert envs[-1].chunk.reason == "aborted"
    assert [e.ordinal for e in envs] == list(range(len(envs)))


async def test_translated_dialects_over_real_sockets(nc, topology, scripted):
    """OpenAI caller -> an Anthropic-dialect provider and back, both played by the scripted
    provider standing in for the real APIs via their base-URL variables."""
    env = provider_env(
        TOKENWIRE_ANTHROPIC_BASE_URL=scripted.url, TOKENWIRE_OPENAI_BASE_URL=scripted.url + "/v1"
    )
    real = await broker_deps(nc, topology)
    settings = GatewaySettings(port=0, keys=frozenset({GATEWAY_KEY}), provider_env=env)
    oa_msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "weather?"}]
    an_msgs: list[MessageParam] = [{"role": "user", "content": "weather?"}]
    oa_tools: list[ChatCompletionToolUnionParam] = [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    ]
    an_tools: list[ToolUnionParam] = [{"name": "get_weather", "input_schema": {"type": "object"}}]
    try:
        async with GatewayServer(settings, real.deps) as server:
            async with (
                openai.AsyncOpenAI(
                    base_url=server.url + "/v1", api_key=GATEWAY_KEY, max_retries=0
                ) as oa,
                oa.chat.completions.stream(
                    model="anthropic/tools", messages=oa_msgs, tools=oa_tools
                ) as s,
            ):
                oa_final = await s.get_final_completion()
            async with (
                anthropic.AsyncAnthropic(
                    base_url=server.url, api_key=GATEWAY_KEY, max_retries=0
                ) as an,
                an.messages.stream(
                    model="openai/tools", max_tokens=50, messages=an_msgs, tools=an_tools
                ) as s,
            ):
                an_final = await s.get_final_message()
    finally:
        await real.aclose()
    to_anthropic = {
        "model": "tools",
        "messages": oa_msgs,
        "max_tokens": 4096,
        "stream": True,
        "tools": an_tools,
    }
    want_a = expected_outcome("tools", to_anthropic, SCRIPTED, dialect="anthropic")
    oa_calls = oa_final.choices[0].message.tool_calls
    assert oa_calls is not None
    got_a = [(c.id, c.function.name, json.loads(c.function.arguments)) for c in oa_calls]
    assert got_a == [(c.id, c.name, json.loads(c.arguments)) for c in want_a.tool_calls]
    to_openai = {
        "model": "tools",
        "messages": an_msgs,
        "stream": True,
        "stream_options": {"include_usage": True},
        "tools": oa_tools,
    }
    want_o = expected_outcome("tools", to_openai, SCRIPTED, dialect="openai")
    got_o = [(b.id, b.name, b.input) for b in an_final.content if b.type == "tool_use"]
    assert got_o == [(c.id, c.name, json.loads(c.arguments)) for c in want_o.tool_calls]
    assert want_o.usage is not None
    assert an_final.usage.input_tokens == want_o.usage.input_tokens
