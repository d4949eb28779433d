"""OpenAI and Anthropic callers reaching Gemini and the OpenAI Responses API.

Expected answers come from the recordings themselves (Gemini's parts read with ``json``) or
from the openai SDK's own Responses accumulator; expected request bodies are written by hand
from the providers' API references, and for Gemini checked against a recorded request that a
real client sent for the same conversation.
"""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import openai
from anthropic.types import MessageParam
from nats.aio.client import Client

from tests.fixtures.recordings import recordings_dir
from tests.gateway._helpers import (
    GATEWAY_KEY,
    _mock_client,
    collect_openai,
    make_rig,
    provider_env,
    recording,
    text_of,
)
from tests.providers.conftest import RecordingServer, Route, random_cuts
from tokenwire.broker import Topology
from tokenwire.schemas import ChunkEnvelope, Finish, chunk_envelopes
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps

GEMINI_KEY = "gm-SENTINEL-0a1b2c3d"
GEMINI_PATH = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
SKIP = "skip_thought_signature_validator"  # Google's documented value, written out here


def gemini_rig(body: bytes) -> Any:
    return make_rig(body, provider_env=provider_env(GEMINI_API_KEY=GEMINI_KEY))


def gemini_parts(body: bytes) -> tuple[str, list[dict[str, Any]], str]:
    """(answer text without thoughts, function calls, last finishReason) read from the SSE."""
    text, calls, finish = "", [], ""
    for line in body.decode().splitlines():
        if not line.startswith("data: "):
            continue
        for candidate in json.loads(line[6:]).get("candidates", []):
            for part in candidate.get("content", {}).get("parts", []):
                if "functionCall" in part:
                    calls.append(part["functionCall"])
                elif not part.get("thought"):
                    text += part.get("text", "")
            finish = candidate.get("finishReason", finish)
    return text, calls, finish


def sent(rig: Any) -> dict[str, Any]:
    body: dict[str, Any] = msgspec.json.decode(rig.upstream.requests[0][1])
    return body


# -- Gemini ---------------------------------------------------------------------------------


async def test_openai_caller_to_gemini_text_matches_a_real_clients_request():
    name = "google/gemini-stream-text"
    body = recording(f"{name}.sse")
    rig = gemini_rig(body)
    stream = await rig.openai().chat.completions.create(
        model="gemini/gemini-2.5-flash",
        messages=[
            {"role": "system", "content": "You are a helpful chatbot."},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        temperature=0.0,
        stream=True,
    )
    got = await collect_openai(stream)
    text, _, finish = gemini_parts(body)
    assert (got["text"], got["finish"], finish) == (text, "stop", "STOP")
    route, _ = rig.upstream.requests[0]
    assert route.url.endswith(GEMINI_PATH)
    assert route.headers["x-goog-api-key"] == GEMINI_KEY
    recorded = json.loads((recordings_dir() / f"{name}.request.json").read_text())
    recorded["systemInstruction"].pop("role")  # optional; Gemini reads it as the system's
    assert sent(rig) == recorded


async def test_openai_caller_gets_a_gemini_function_call_as_a_tool_call():
    name = "google/gemini-stream-function-call-thought-signature"
    body = recording(f"{name}.sse")
    rig = gemini_rig(body)
    tool = {
        "type": "function",
        "function": {
            "name": "get_country",
            "description": "",
            "parameters": {"additionalProperties": False, "properties": {}, "type": "object"},
        },
    }
    stream = await rig.openai().chat.completions.create(
        model="gemini/gemini-2.5-flash",
        messages=[
            {"role": "user", "content": "What is the capital of the user country? Call the tool"}
        ],
        tools=[tool],
        stream=True,
    )
    got = await collect_openai(stream)
    _, calls, _ = gemini_parts(body)
    assert [(c["name"], json.loads(c["arguments"])) for c in got["tool_calls"]] == [
        (c["name"], c["args"]) for c in calls
    ]
    assert got["finish"] == "tool_calls"
    recorded = json.loads((recordings_dir() / f"{name}.request.json").read_text())
    declaration = recorded["tools"][0]["functionDeclarations"][0]  # snake_case in the recording
    declaration["parametersJsonSchema"] = declaration.pop("parameters_json_schema")
    assert sent(rig)["tools"] == recorded["tools"]
    assert sent(rig)["contents"] == recorded["contents"]


async def test_gemini_max_tokens_is_finish_length_for_openai_callers():
    body = recording("google/gemini-stream-max-tokens.sse")
    rig = gemini_rig(body)
    stream = await rig.openai().chat.completions.create(
        model="gemini/gemini-2.5-flash",
        messages=[{"role": "user", "content": "list the states"}],
        max_tokens=8,
        stream=True,
    )
    got = await collect_openai(stream)
    text, _, finish = gemini_parts(body)
    assert (got["text"], got["finish"], finish) == (text, "length", "MAX_TOKENS")
    assert sent(rig)["generationConfig"] == {"maxOutputTokens": 8}


async def test_anthropic_caller_to_gemini_thinking_gets_the_answer_text():
    body = recording("google/gemini-stream-thinking.sse")
    rig = gemini_rig(body)
    async with rig.anthropic().messages.stream(
        model="gemini/gemini-2.5-flash",
        max_tokens=1000,
        messages=[{"role": "user", "content": "How do I cross the street?"}],
    ) as stream:
        got = await stream.get_final_message()
    text, _, _ = gemini_parts(body)
    assert text_of(got) == text
    assert got.stop_reason == "end_turn"
    assert [b.type for b in got.content] == ["thinking", "text"]


async def test_tool_round_trip_to_gemini_names_results_after_their_calls():
    rig = gemini_rig(recording("google/gemini-stream-text.sse"))
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"c":1}'}},
                {"id": "c2", "type": "function", "function": {"name": "v", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        {"role": "tool", "tool_call_id": "c1", "content": "sun"},
    ]
    tools = [
        {"type": "function", "function": {"name": "w", "description": "weather"}},
        {"type": "function", "function": {"name": "v", "parameters": {"type": "object"}}},
    ]
    body = {
        "model": "gemini/gemini-2.5-flash",
        "messages": messages,
        "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "w"}},
        "top_p": 0.5,
        "stop": ["END"],
    }
    async with rig.client(authorization=f"Bearer {GATEWAY_KEY}") as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert sent(rig) == {
        "contents": [
            {"role": "user", "parts": [{"text": "weather?"}]},
            {
                "role": "model",
                "parts": [
                    {"text": "Checking."},
                    # No signature kept (ids from elsewhere): Google's skip value goes on the
                    # turn's first call, where Gemini puts a turn's signature itself
                    {"functionCall": {"name": "w", "args": {"c": 1}}, "thoughtSignature": SKIP},
                    {"functionCall": {"name": "v", "args": {}}},
                ],
            },
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "v", "response": {"result": "rain"}}},
                    {"functionResponse": {"name": "w", "response": {"result": "sun"}}},
                ],
            },
        ],
        "tools": [
            {
                "functionDeclarations": [
                    {
                        "name": "w",
                        "description": "weather",
                        "parametersJsonSchema": {"type": "object", "properties": {}},
                    },
                    {"name": "v", "parametersJsonSchema": {"type": "object"}},
                ]
            }
        ],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["w"]}},
        "generationConfig": {"topP": 0.5, "stopSequences": ["END"]},
    }


async def test_a_gemini_thought_signature_goes_back_with_its_call():
    """Gemini 3 needs each function call's signature in the next request: an OpenAI caller
    that returns the tool call's id as it got it returns the signature with it."""
    name = "google/gemini-stream-function-call-thought-signature"
    body = recording(f"{name}.sse")
    rig = gemini_rig(body)
    first = [{"role": "user", "content": "What is the capital of the user country?"}]
    stream = await rig.openai().chat.completions.create(
        model="gemini/gemini-2.5-flash", messages=first, stream=True
    )
    (call,) = (await collect_openai(stream))["tool_calls"]
    history = [
        *first,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call["id"],
                    "type": "function",
                    "function": {"name": call["name"], "arguments": call["arguments"]},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call["id"], "content": "France"},
    ]
    async with rig.client(authorization=f"Bearer {GATEWAY_KEY}") as client:
        response = await client.post(
            "/v1/chat/completions", json={"model": "gemini/gemini-2.5-flash", "messages": history}
        )
    assert response.status_code == 200, response.text
    recorded_signature = next(
        part["thoughtSignature"]
        for line in body.decode().splitlines()
        if line.startswith("data: ")
        for candidate in json.loads(line[6:])["candidates"]
        for part in candidate["content"]["parts"]
        if "functionCall" in part
    )
    sent_back = msgspec.json.decode(rig.upstream.requests[1][1])["contents"]
    assert sent_back[1] == {
        "role": "model",
        "parts": [
            {
                "functionCall": {"name": "get_country", "args": {}},
                "thoughtSignature": recorded_signature,
            }
        ],
    }
    assert sent_back[2] == {
        "role": "user",
        "parts": [{"functionResponse": {"name": "get_country", "response": {"result": "France"}}}],
    }


async def test_a_tool_result_gemini_cannot_name_is_a_400_and_calls_nobody():
    rig = gemini_rig(recording("google/gemini-stream-text.sse"))
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "nowhere", "content": "x"},
    ]
    async with rig.client(authorization=f"Bearer {GATEWAY_KEY}") as client:
        response = await client.post(
            "/v1/chat/completions", json={"model": "gemini/g", "messages": messages}
        )
    assert response.status_code == 400
    assert "nowhere" in response.json()["error"]["message"]
    assert rig.upstream.requests == []
    assert rig.sink.messages == []


# -- OpenAI Responses -----------------------------------------------------------------------


async def responses_oracle(body: bytes) -> Any:
    """The response object of the terminal event (completed, incomplete or failed), as the
    openai SDK parses a Responses SSE body."""
    client = openai.AsyncOpenAI(base_url="http://p/v1", api_key="x", http_client=_mock_client(body))
    final = None
    async for event in await client.responses.create(model="m", input="x", stream=True):
        if event.type in ("response.completed", "response.incomplete", "response.failed"):
            final = event.response
    assert final is not None
    return final


async def test_openai_caller_to_responses_text():
    body = recording("openai-responses/responses-text.sse")
    rig = make_rig(body)
    stream = await rig.openai().chat.completions.create(
        model="openai-responses/gpt-4o",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        max_tokens=30,
        stream=True,
    )
    got = await collect_openai(stream)
    want = await responses_oracle(body)
    assert (got["text"], got["finish"]) == (want.output_text, "stop")
    assert got["usage"] is None  # the caller did not ask for usage
    assert sent(rig) == {
        "model": "gpt-4o",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
        "stream": True,
        "store": False,
        "instructions": "be brief",
        "max_output_tokens": 30,
    }


async def test_openai_caller_gets_responses_parallel_function_calls():
    body = recording("openai-responses/responses-parallel-function-calls.sse")
    rig = make_rig(body)
    stream = await rig.openai().chat.completions.create(
        model="openai-responses/gpt-4o",
        messages=[{"role": "user", "content": "secrets for mellon, radiance"}],
        tools=[{"type": "function", "function": {"name": "secret_retrieval_tool"}}],
        stream=True,
    )
    got = await collect_openai(stream)
    want = await responses_oracle(body)
    calls = [item for item in want.output if item.type == "function_call"]
    assert [(c["id"], c["name"], c["arguments"]) for c in got["tool_calls"]] == [
        (c.call_id, c.name, c.arguments) for c in calls
    ]
    assert got["finish"] == "tool_calls"
    assert sent(rig)["tools"] == [
        {
            "type": "function",
            "name": "secret_retrieval_tool",
            "parameters": {"type": "object", "properties": {}},
            "strict": False,
        }
    ]


async def test_responses_incomplete_is_max_tokens_for_anthropic_callers():
    body = recording("openai-responses/responses-incomplete-max-output-tokens.sse")
    rig = make_rig(body)
    got = await rig.anthropic().messages.create(
        model="openai-responses/gpt-4o",
        max_tokens=50,
        messages=[{"role": "user", "content": "write a lot"}],
    )
    want = await responses_oracle(body)
    assert (text_of(got), got.stop_reason) == (want.output_text, "max_tokens")
    assert want.status == "incomplete"


async def test_tool_round_trip_to_responses_keeps_call_ids():
    rig = make_rig(recording("openai-responses/responses-text.sse"))
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"c":1}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sun"},
    ]
    body = {"model": "openai-responses/gpt-4o", "messages": messages, "tool_choice": "none"}
    async with rig.client(authorization=f"Bearer {GATEWAY_KEY}") as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert sent(rig)["input"] == [
        {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"c":1}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sun"},
    ]
    assert sent(rig)["tool_choice"] == "none"


async def test_stop_sequences_cannot_reach_responses_400():
    rig = make_rig(recording("openai-responses/responses-text.sse"))
    body = {
        "model": "openai-responses/gpt-4o",
        "messages": [{"role": "user", "content": "x"}],
        "stop": ["END"],
    }
    async with rig.client(authorization=f"Bearer {GATEWAY_KEY}") as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "stop"
    assert rig.upstream.requests == []


# -- over real sockets ----------------------------------------------------------------------


async def test_gemini_through_the_gateway_over_real_sockets(nc: Client, topology: Topology):
    """The OpenAI SDK -> the gateway (real socket, real broker) -> a loopback server playing
    Gemini (the recording cut at random byte positions) -> back in the OpenAI dialect."""
    body = recording("google/gemini-stream-function-call-thought-signature.sse")
    provider = RecordingServer()
    await provider.start()
    route = Route(body, random_cuts(len(body), random.Random("gateway-gemini")))
    provider.serve(GEMINI_PATH, route)
    env = provider_env(
        GEMINI_API_KEY=GEMINI_KEY, TOKENWIRE_GEMINI_BASE_URL=f"http://127.0.0.1:{provider.port}"
    )
    real = await broker_deps(nc, topology)
    settings = GatewaySettings(port=0, keys=frozenset({GATEWAY_KEY}), provider_env=env)
    try:
        async with (
            GatewayServer(settings, real.deps) as server,
            openai.AsyncOpenAI(
                base_url=server.url + "/v1", api_key=GATEWAY_KEY, max_retries=0
            ) as client,
        ):
            response = await client.chat.completions.with_raw_response.create(
                model="gemini/gemini-2.5-flash",
                messages=[{"role": "user", "content": "Call the tool"}],
                stream=True,
                extra_headers={"x-tokenwire-session": "gemini-real"},
            )
            got = await collect_openai(response.parse())
    finally:
        await real.aclose()
        await provider.stop()
    _, calls, _ = gemini_parts(body)
    assert [(c["name"], json.loads(c["arguments"])) for c in got["tool_calls"]] == [
        (c["name"], c["args"]) for c in calls
    ]
    ((path, headers, _),) = route.requests
    assert (path, headers["x-goog-api-key"]) == (GEMINI_PATH, GEMINI_KEY)
    envs = await stored_step(nc, topology, "gemini-real")
    assert [e.ordinal for e in envs] == list(range(len(envs)))
    assert isinstance(envs[-1].chunk, Finish)
    assert envs[-1].chunk.reason == "tool-calls"
    assert {(e.provider, e.model) for e in envs} == {("gemini", "gemini-2.5-flash")}


async def stored_step(nc: Client, topology: Topology, session: str) -> list[ChunkEnvelope]:
    """The session's stored envelopes up to its finish (the gateway answered only after the
    broker acked them all)."""
    js = nc.jetstream()
    subject = topology.session_filter(session)
    sub = await js.subscribe(subject, ordered_consumer=True, stream=topology.stream)
    envs: list[ChunkEnvelope] = []
    while not envs or not isinstance(envs[-1].chunk, Finish):
        envs += chunk_envelopes((await sub.next_msg(timeout=5)).data)
    await sub.unsubscribe()
    return envs


SIGNED = "call_0_get_country__thought__c2lnbmF0dXJl"  # base64url of b"signature", by hand


def openai_history(call_id: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "country?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "get_country", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": "France"},
    ]


async def test_signed_ids_go_plain_to_an_openai_compatible_provider():
    """OpenAI caps tool call ids at 40 characters: a conversation that continues on another
    provider (a fallback, a switch) loses the signatures, keeps its ids' pairing."""
    rig = make_rig(recording("openai/chat-text-include-usage.sse"))
    async with rig.client(authorization=f"Bearer {GATEWAY_KEY}") as client:
        response = await client.post(
            "/v1/chat/completions",
            json={"model": "openai/gpt-4o", "messages": openai_history(SIGNED), "top_p": 0.5},
        )
    assert response.status_code == 200, response.text
    body = sent(rig)
    assert body["messages"] == openai_history("call_0_get_country")
    assert body["top_p"] == 0.5


async def test_signed_ids_go_plain_when_translated_to_anthropic():
    rig = make_rig(recording("anthropic/messages-text-short.sse"))
    async with rig.client(authorization=f"Bearer {GATEWAY_KEY}") as client:
        response = await client.post(
            "/v1/chat/completions",
            json={"model": "anthropic/claude-sonnet-4-5", "messages": openai_history(SIGNED)},
        )
    assert response.status_code == 200, response.text
    blocks = [b for m in sent(rig)["messages"] for b in m["content"]]
    assert [b.get("id") or b.get("tool_use_id") for b in blocks if "text" not in b] == [
        "call_0_get_country",
        "call_0_get_country",
    ]


async def test_signed_ids_go_plain_from_an_anthropic_caller_to_anthropic():
    rig = make_rig(recording("anthropic/messages-text-short.sse"))
    messages: list[MessageParam] = [
        {"role": "user", "content": "country?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": SIGNED, "name": "get_country", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": SIGNED, "content": "France"}],
        },
    ]
    async with rig.anthropic() as client:
        await client.messages.create(
            model="anthropic/claude-sonnet-4-5", max_tokens=10, messages=messages
        )
    sent_messages = sent(rig)["messages"]
    assert sent_messages[1]["content"][0]["id"] == "call_0_get_country"
    assert sent_messages[2]["content"][0]["tool_use_id"] == "call_0_get_country"
    assert sent_messages[0] == messages[0]
