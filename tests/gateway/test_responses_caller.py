"""``POST /v1/responses`` as a caller dialect, with the openai SDK's Responses API against a
real gateway (real socket, real nats-server) in front of the scripted provider, which answers
in Chat Completions (``scripted/...``, ``openai/...``) or Anthropic Messages (``anthropic/...``).
Ground truth: the scripted provider's ``expected_outcome`` for the request it received."""

from __future__ import annotations

import json
from typing import cast

import openai
import pytest
from openai.types.responses import ToolParam

from tests.fixtures.recordings import recordings_dir
from tests.gateway._helpers import GATEWAY_KEY, provider_env
from tokenwire.fold import fold
from tokenwire.providers import normalise_body
from tokenwire.schemas import Message
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.services.gateway._dialects.openai_responses import ResponsesStreamEncoder
from tokenwire.services.scripted_provider import (
    Dialect,
    ExpectedStep,
    ScriptedServer,
    ScriptedSettings,
    expected_outcome,
)

SCRIPTED = ScriptedSettings(seed=9, length=6)
# Cast: the SDK's FunctionToolParam requires ``strict``, and these tools are sent without it.
TOOLS = cast(
    "list[ToolParam]",
    [
        {
            "type": "function",
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {}},
        },
        {
            "type": "function",
            "name": "get_time",
            "parameters": {"type": "object", "properties": {}},
        },
    ],
)
ROUTES = ["scripted/tools", "openai/tools", "anthropic/tools"]


@pytest.fixture
async def gateway(nc, topology):
    async with ScriptedServer(SCRIPTED) as scripted:
        env = provider_env(
            TOKENWIRE_SCRIPTED_BASE_URL=scripted.url,
            TOKENWIRE_ANTHROPIC_BASE_URL=scripted.url,
            TOKENWIRE_OPENAI_BASE_URL=scripted.url + "/v1",
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


def _want(scripted: ScriptedServer) -> ExpectedStep:
    got = scripted.received[-1]
    dialect: Dialect = "anthropic" if got.path == "/v1/messages" else "openai"
    return expected_outcome("tools", got.json(), SCRIPTED, headers=got.headers, dialect=dialect)


@pytest.mark.parametrize("model", ROUTES)
async def test_streamed_tool_calls_through_responses(gateway, model: str) -> None:
    url, scripted = gateway
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=GATEWAY_KEY, max_retries=0) as oa:
        events = []
        async with oa.responses.stream(
            model=model, input="weather and time?", tools=TOOLS, instructions="be brief"
        ) as stream:
            async for event in stream:
                events.append(event)
            final = await stream.get_final_response()
    want = _want(scripted)
    calls = [
        (o.call_id, o.name, json.loads(o.arguments))
        for o in final.output
        if o.type == "function_call"
    ]
    assert calls == [(c.id, c.name, json.loads(c.arguments)) for c in want.tool_calls]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert kinds.count("response.output_item.added") == kinds.count("response.output_item.done")
    assert "response.function_call_arguments.delta" in kinds
    assert final.usage is not None
    assert want.usage is not None
    assert want.usage.input_tokens is not None
    assert final.usage.input_tokens == want.usage.input_tokens + (want.usage.cache_read_tokens or 0)
    body = scripted.received[-1].json()
    system = body.get("system") or body["messages"][0]["content"]
    assert system == "be brief"


@pytest.mark.parametrize("model", ["scripted/text", "anthropic/text"])
async def test_text_through_responses_streaming_and_not(gateway, model: str) -> None:
    url, scripted = gateway
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=GATEWAY_KEY, max_retries=0) as oa:
        response = await oa.responses.create(model=model, input="hello")
        got = scripted.received[-1]
        dialect: Dialect = "anthropic" if got.path == "/v1/messages" else "openai"
        want = expected_outcome("text", got.json(), SCRIPTED, headers=got.headers, dialect=dialect)
        assert response.output_text == want.text
        assert response.status == "completed"
        deltas = []
        async with oa.responses.stream(model=model, input="hello") as stream:
            async for event in stream:
                if event.type == "response.output_text.delta":
                    deltas.append(event.delta)
            final = await stream.get_final_response()
    assert "".join(deltas) == final.output_text != ""


async def test_a_refused_field_is_a_400_naming_it(gateway) -> None:
    url, _ = gateway
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=GATEWAY_KEY, max_retries=0) as oa:
        with pytest.raises(openai.BadRequestError) as info:
            await oa.responses.create(
                model="anthropic/text", input="x", previous_response_id="resp_earlier"
            )
    assert isinstance(info.value.body, dict)
    assert info.value.body["param"] == "previous_response_id"
    assert "anthropic/text" in info.value.body["message"]


@pytest.mark.parametrize(
    "name",
    [
        "responses-text",
        "responses-parallel-function-calls",
        "responses-reasoning-summary",
        "responses-incomplete-max-output-tokens",
    ],
)
def test_encoded_events_fold_back_to_the_recordings_message(name: str) -> None:
    """Recording -> chunks -> our Responses events -> the Responses normaliser -> the same fold."""
    body = (recordings_dir() / "openai-responses" / f"{name}.sse").read_bytes()
    chunks = normalise_body("openai-responses", body)
    encoder = ResponsesStreamEncoder(response_id="resp_x", model="m", created=0)
    ours = encoder.start() + b"".join(encoder.encode(c) for c in chunks) + encoder.end()
    again = fold(normalise_body("openai-responses", ours))
    original = fold(chunks)
    assert isinstance(again, Message)
    assert isinstance(original, Message)
    assert again.content == original.content
    assert again.finish_reason == original.finish_reason
    assert again.usage == original.usage


def _event_kinds(body: bytes) -> list[tuple[str, int]]:
    events = [
        json.loads(line[6:]) for line in body.decode().splitlines() if line.startswith("data: ")
    ]
    return [(e["type"], e["sequence_number"]) for e in events]


@pytest.mark.parametrize(
    "name",
    [
        "responses-text",
        "responses-parallel-function-calls",
        "responses-reasoning-then-function-call",
        "responses-incomplete-max-output-tokens",
    ],
)
def test_encoded_events_are_the_recordings_own_events(name: str) -> None:
    """Re-rendered from its chunks (a resumed Responses step, ``GET /v1/responses/{id}``),
    a recording whose events all carry chunks gets OpenAI's own event kinds in OpenAI's
    order, so its ``sequence_number``s are the ones the first stream had. An encrypted
    reasoning item (no summary text) is ``output_item.added`` then ``.done``, no summary
    part (the encoder announced an empty one, three events more, before the fix)."""
    body = (recordings_dir() / "openai-responses" / f"{name}.sse").read_bytes()
    encoder = ResponsesStreamEncoder(response_id="resp_x", model="m", created=0)
    chunks = normalise_body("openai-responses", body)
    ours = encoder.start() + b"".join(encoder.encode(c) for c in chunks) + encoder.end()
    assert _event_kinds(ours) == _event_kinds(body)


@pytest.fixture
async def responses_gateway(nc, topology):
    """The scripted provider replaying a real Responses recording as an OpenAI Responses API."""
    recording = recordings_dir() / "openai-responses" / "responses-parallel-function-calls.sse"
    async with ScriptedServer(ScriptedSettings(recording=str(recording))) as scripted:
        env = provider_env(TOKENWIRE_OPENAI_RESPONSES_BASE_URL=scripted.url + "/v1")
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
                yield server.url, scripted, recording.read_bytes()
        finally:
            await real.aclose()


async def test_responses_to_responses_is_forwarded_untouched(responses_gateway) -> None:
    url, scripted, recorded = responses_gateway
    sent_events = [
        json.loads(line[6:]) for line in recorded.decode().splitlines() if line.startswith("data: ")
    ]
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=GATEWAY_KEY, max_retries=0) as oa:
        events = []
        async with oa.responses.stream(
            model="openai-responses/recording",
            input=[{"role": "user", "content": "the secret?"}],
            tools=TOOLS,
            store=True,
            include=["reasoning.encrypted_content"],
            extra_body={"a_vendor_field": 1},
        ) as stream:
            async for event in stream:
                events.append(event.model_dump(exclude_unset=True))
            final = await stream.get_final_response()
    assert [e["type"] for e in events] == [e["type"] for e in sent_events]
    assert [e["sequence_number"] for e in events] == [e["sequence_number"] for e in sent_events]
    calls = [(o.call_id, o.arguments) for o in final.output if o.type == "function_call"]
    want = [
        (e["item"]["call_id"], e["item"]["arguments"])
        for e in sent_events
        if e["type"] == "response.output_item.done"
    ]
    assert calls == want
    body = scripted.received[-1].json()
    assert (body["model"], body["stream"], body["store"], body["a_vendor_field"]) == (
        "recording",
        True,
        True,
        1,
    )
    assert body["include"] == ["reasoning.encrypted_content"]
    assert scripted.received[-1].path == "/v1/responses"
