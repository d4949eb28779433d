"""Translation that never lies: every field of every cross-dialect pair is translated (seen at
the provider) or refused with a 400 naming it and the route; the opt-in drops and says so.

The real-socket tests run the official SDKs against a real gateway publishing to a real
nats-server, in front of the scripted provider, which stands in for OpenAI and Anthropic via
their base-URL variables and records every request it receives. The Responses and Gemini
targets have no scripted stand-in: their translated bodies are checked field by field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import msgspec
import openai
import pytest
from anthropic.types import ToolUnionParam
from openai.types.chat import ChatCompletionToolUnionParam

from tests.gateway._helpers import GATEWAY_KEY, provider_env
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.services.gateway._dialects import (
    ANTHROPIC_MESSAGES,
    OPENAI_CHAT,
    OPENAI_RESPONSES,
    CallerCodec,
)
from tokenwire.services.gateway._dialects.anthropic_messages import (
    AnthropicRequest,
    validate_anthropic,
)
from tokenwire.services.gateway._dialects.openai_chat import OpenAIChatRequest, validate_openai
from tokenwire.services.gateway._dialects.openai_responses import ResponsesRequest
from tokenwire.services.gateway._dialects.translation import (
    DROPPED_HEADER,
    TABLE,
    UntranslatableFieldError,
    counts,
    render_markdown,
    replace_section,
)
from tokenwire.services.gateway._errors import InvalidRequestError
from tokenwire.services.gateway._routing.provider_call import CallerInput, provider_call
from tokenwire.services.gateway._routing.routing import resolve
from tokenwire.services.scripted_provider import ScriptedServer, ScriptedSettings

DOCS = Path(__file__).resolve().parents[2] / "docs" / "providers.md"
SCRIPTED = ScriptedSettings(seed=5, length=6)
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER_OA: list[ChatCompletionToolUnionParam] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}},
    }
]
WEATHER_AN: list[ToolUnionParam] = [
    {"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}
]
PIXEL = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGA"
    + "hKmMIQAAAABJRU5ErkJggg=="
)


# -- the table itself ---------------------------------------------------------------------------


def test_docs_table_is_generated_from_the_table() -> None:
    doc = DOCS.read_text()
    assert replace_section(doc) == doc, (
        "docs/providers.md drifted: python -m tokenwire.services.gateway._dialects.translation "
        "docs/providers.md"
    )
    assert render_markdown() in doc


@pytest.mark.parametrize("pair", sorted(TABLE), ids=lambda p: f"{p[0]}->{p[1]}")
def test_every_field_the_gateway_reads_has_a_fate(pair: tuple[str, str]) -> None:
    struct = {
        "openai-chat": OpenAIChatRequest,
        "anthropic-messages": AnthropicRequest,
        "openai-responses": ResponsesRequest,
    }[pair[0]]
    fields = set(struct.__struct_fields__)
    assert fields <= set(TABLE[pair]), fields - set(TABLE[pair])


def test_the_counts() -> None:
    c = counts()
    assert c["translated"] + c["refused"] == sum(len(t) for t in TABLE.values())
    assert c["translated"] > c["refused"] > 0


# -- bodies for the targets without a scripted stand-in ---------------------------------------


def _translated(caller: str, model: str, body: dict[str, Any], **headers: str) -> Any:
    codecs: dict[str, CallerCodec[Any]] = {
        "openai-chat": OPENAI_CHAT,
        "anthropic-messages": ANTHROPIC_MESSAGES,
        "openai-responses": OPENAI_RESPONSES,
    }
    ep = codecs[caller]
    env = provider_env(GEMINI_API_KEY="g-key")
    route = resolve(model, ep.dialect, env)
    req = ep.parse(body)
    call = provider_call(ep, req, route, CallerInput(body, headers, env, 4096))
    return msgspec.json.decode(call.body), call


OA_BASE = {"model": "x", "messages": [{"role": "user", "content": "hi"}]}
AN_BASE = {"model": "x", "max_tokens": 2048, "messages": [{"role": "user", "content": "hi"}]}


def test_openai_fields_to_responses() -> None:
    body, _ = _translated(
        "openai-chat",
        "openai-responses/gpt-5",
        {
            **OA_BASE,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "w", "schema": SCHEMA, "strict": True},
            },
            "reasoning_effort": "low",
            "parallel_tool_calls": False,
            "tools": WEATHER_OA,
            "user": "u-1",
            "metadata": {"k": "v"},
            "store": True,
        },
    )
    assert body["text"] == {
        "format": {"type": "json_schema", "name": "w", "schema": SCHEMA, "strict": True}
    }
    assert body["reasoning"] == {"effort": "low"}
    assert (body["parallel_tool_calls"], body["user"], body["metadata"], body["store"]) == (
        False,
        "u-1",
        {"k": "v"},
        True,
    )


def test_openai_fields_to_gemini() -> None:
    body, _ = _translated(
        "openai-chat",
        "gemini/gemini-2.5-flash",
        {
            **OA_BASE,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "w", "schema": SCHEMA},
            },
            "reasoning_effort": "medium",
            "seed": 7,
            "stop": ["END"],
            "frequency_penalty": 0.5,
            "presence_penalty": 0.25,
        },
    )
    assert body["generationConfig"] == {
        "responseMimeType": "application/json",
        "responseJsonSchema": SCHEMA,
        "thinkingConfig": {"thinkingBudget": 8192, "includeThoughts": True},
        "seed": 7,
        "stopSequences": ["END"],
        "frequencyPenalty": 0.5,
        "presencePenalty": 0.25,
    }


def test_anthropic_fields_to_responses_and_gemini() -> None:
    sent = {
        **AN_BASE,
        "thinking": {"type": "enabled", "budget_tokens": 2000},
        "metadata": {"user_id": "u-9"},
        "tools": WEATHER_AN,
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    }
    body, _ = _translated("anthropic-messages", "openai-responses/gpt-5", sent)
    assert (body["reasoning"], body["user"], body["parallel_tool_calls"]) == (
        {"effort": "medium"},
        "u-9",
        False,
    )
    gemini = {k: v for k, v in sent.items() if k not in ("metadata", "tool_choice")}
    body, _ = _translated("anthropic-messages", "gemini/gemini-2.5-flash", {**gemini, "top_k": 5})
    assert body["generationConfig"]["thinkingConfig"] == {
        "thinkingBudget": 2000,
        "includeThoughts": True,
    }
    assert body["generationConfig"]["topK"] == 5


@pytest.mark.parametrize(
    ("caller", "model", "extra", "field"),
    [
        ("openai-chat", "gemini/g", {"parallel_tool_calls": True}, "parallel_tool_calls"),
        ("openai-chat", "gemini/g", {"user": "u"}, "user"),
        ("openai-chat", "openai-responses/m", {"stop": "x"}, "stop"),
        ("openai-chat", "openai-responses/m", {"seed": 1}, "seed"),
        ("openai-chat", "gemini/g", {"logprobs": True}, "logprobs"),
        ("openai-chat", "gemini/g", {"a_future_field": 1}, "a_future_field"),
        ("anthropic-messages", "gemini/g", {"metadata": {"user_id": "u"}}, "metadata"),
        ("anthropic-messages", "openai-responses/m", {"top_k": 3}, "top_k"),
        (
            "anthropic-messages",
            "gemini/g",
            {
                "tools": WEATHER_AN,
                "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
            },
            "tool_choice.disable_parallel_tool_use",
        ),
        (
            "anthropic-messages",
            "gemini/g",
            {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
            "tools: server tools",
        ),
    ],
)
def test_refused_toward_responses_and_gemini(
    caller: str, model: str, extra: dict[str, Any], field: str
) -> None:
    base = OA_BASE if caller == "openai-chat" else AN_BASE
    with pytest.raises(UntranslatableFieldError) as info:
        _translated(caller, model, {**base, **extra})
    assert info.value.param == field
    assert model in info.value.message
    _, call = _translated(caller, model, {**base, **extra}, **{"x-tokenwire-drop-params": "true"})
    assert call.response_headers == {DROPPED_HEADER: field}


def test_a_server_tool_is_never_sent_as_an_empty_function() -> None:
    tools = [{"type": "web_search_20250305", "name": "web_search"}, *WEATHER_AN]
    body, call = _translated(
        "anthropic-messages",
        "gemini/g",
        {**AN_BASE, "tools": tools},
        **{"x-tokenwire-drop-params": "true"},
    )
    names = [d["name"] for d in body["tools"][0]["functionDeclarations"]]
    assert names == ["get_weather"]
    assert call.response_headers == {DROPPED_HEADER: "tools: server tools"}


def test_reasoning_effort_must_fit_under_max_tokens_toward_anthropic() -> None:
    with pytest.raises(InvalidRequestError, match="at least 1024"):
        _translated(
            "openai-chat",
            "anthropic/claude",
            {**OA_BASE, "reasoning_effort": "high", "max_completion_tokens": 500},
        )
    body, _ = _translated(
        "openai-chat", "anthropic/claude", {**OA_BASE, "reasoning_effort": "high"}
    )
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 24576}
    assert body["max_tokens"] == 24576 + 4096  # no caller limit: the default stays for the answer


def test_validation_still_names_bad_types() -> None:
    with pytest.raises(InvalidRequestError):
        validate_openai({**OA_BASE, "seed": "seven"})
    with pytest.raises(InvalidRequestError):
        validate_anthropic({**AN_BASE, "top_k": "five"})


# -- over real sockets -------------------------------------------------------------------------


@pytest.fixture
async def translating(nc, topology):
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


async def test_openai_caller_to_anthropic_every_field_seen_translated(translating) -> None:
    url, scripted = translating
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=GATEWAY_KEY, max_retries=0) as oa:
        raw = await oa.chat.completions.with_raw_response.create(
            model="anthropic/text",
            messages=[
                {"role": "system", "content": "be brief"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "where?"},
                        {
                            "type": "image_url",
                            "image_url": {"url": f"data:image/png;base64,{PIXEL}"},
                        },
                    ],
                },
            ],
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "where", "schema": SCHEMA},
            },
            reasoning_effort="low",
            max_completion_tokens=3000,
            parallel_tool_calls=False,
            tools=WEATHER_OA,
            tool_choice="auto",
            stop=["END"],
            user="user-42",
            temperature=1.0,
            extra_headers={"anthropic-beta": "files-api-2025-04-14"},
        )
        completion = raw.parse()
    assert completion.choices[0].message.content
    assert DROPPED_HEADER not in raw.headers
    got = scripted.received[-1]
    assert got.path == "/v1/messages"
    body = got.json()
    assert body["output_format"] == {"type": "json_schema", "schema": SCHEMA}
    assert got.headers["anthropic-beta"] == "files-api-2025-04-14,structured-outputs-2025-11-13"
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert body["max_tokens"] == 3000
    assert body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert body["stop_sequences"] == ["END"]
    assert body["metadata"] == {"user_id": "user-42"}
    assert body["system"] == "be brief"
    assert body["temperature"] == 1.0
    image = body["messages"][0]["content"][1]
    assert image == {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": PIXEL},
    }


async def test_openai_caller_to_anthropic_refused_then_dropped(translating) -> None:
    url, scripted = translating
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=GATEWAY_KEY, max_retries=0) as oa:
        seen = len(scripted.received)
        with pytest.raises(openai.BadRequestError) as info:
            await oa.chat.completions.create(
                model="anthropic/text", messages=[{"role": "user", "content": "x"}], seed=3
            )
        assert info.value.response.headers["x-should-retry"] == "false"
        error = info.value.body
        assert isinstance(error, dict)
        assert (error["param"], error["code"]) == ("seed", "unsupported_parameter")
        assert "anthropic/text" in error["message"]
        assert "anthropic-messages" in error["message"]
        assert len(scripted.received) == seen  # nothing reached the provider
        raw = await oa.chat.completions.with_raw_response.create(
            model="anthropic/text",
            messages=[{"role": "user", "content": "x"}],
            seed=3,
            metadata={"k": "v"},
            extra_headers={"x-tokenwire-drop-params": "true"},
        )
        assert raw.parse().choices[0].message.content
    assert sorted(raw.headers[DROPPED_HEADER].split(",")) == ["metadata", "seed"]
    body = scripted.received[-1].json()
    assert "seed" not in body
    assert "metadata" not in body


async def test_anthropic_caller_to_openai_every_field_seen_translated(translating) -> None:
    url, scripted = translating
    async with anthropic.AsyncAnthropic(base_url=url, api_key=GATEWAY_KEY, max_retries=0) as an:
        message = await an.messages.create(
            model="openai/text",
            max_tokens=5000,
            system="be brief",
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "where?"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": PIXEL},
                        },
                    ],
                }
            ],
            thinking={"type": "enabled", "budget_tokens": 4000},
            metadata={"user_id": "user-7"},
            tools=WEATHER_AN,
            tool_choice={"type": "auto", "disable_parallel_tool_use": True},
            stop_sequences=["END"],
            extra_body={"top_p": 0.5},
            extra_headers={"openai-organization": "org-1"},
        )
    assert message.content
    got = scripted.received[-1]
    assert got.path == "/v1/chat/completions"
    body = got.json()
    assert got.headers["openai-organization"] == "org-1"
    assert (body["reasoning_effort"], body["user"], body["parallel_tool_calls"]) == (
        "medium",
        "user-7",
        False,
    )
    assert (body["stop"], body["top_p"], body["max_completion_tokens"]) == (["END"], 0.5, 5000)
    assert body["messages"][0] == {"role": "system", "content": "be brief"}
    image = body["messages"][1]["content"][1]
    assert image == {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PIXEL}"}}


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools: server tools"),
        ({"extra_body": {"top_k": 4}}, "top_k"),
        (
            {
                "system": [
                    {"type": "text", "text": "long prompt", "cache_control": {"type": "ephemeral"}}
                ]
            },
            "cache_control",
        ),
    ],
)
async def test_anthropic_caller_to_openai_refused(translating, extra, field) -> None:
    url, scripted = translating
    seen = len(scripted.received)
    async with anthropic.AsyncAnthropic(base_url=url, api_key=GATEWAY_KEY, max_retries=0) as an:
        with pytest.raises(anthropic.BadRequestError) as info:
            await an.messages.create(
                model="openai/text",
                max_tokens=100,
                messages=[{"role": "user", "content": "x"}],
                **extra,
            )
        assert info.value.response.headers["x-should-retry"] == "false"
        assert field in info.value.message
        assert "openai/text" in info.value.message
        assert len(scripted.received) == seen
        raw = await an.messages.with_raw_response.create(
            model="openai/text",
            max_tokens=100,
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"x-tokenwire-drop-params": "true"},
            **extra,
        )
        assert (await raw.parse()).content
    assert raw.headers[DROPPED_HEADER] == field
    body = scripted.received[-1].json()
    assert "tools" not in body
    assert "top_k" not in body
    assert "cache_control" not in msgspec.json.encode(body).decode()


async def test_same_dialect_forwards_the_body_untouched(translating) -> None:
    url, scripted = translating
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=GATEWAY_KEY, max_retries=0) as oa:
        await oa.chat.completions.create(
            model="scripted/text",
            messages=[{"role": "user", "content": "x"}],
            seed=3,
            logit_bias={"50256": -100},
            extra_body={"a_vendor_field": {"kept": True}},
            extra_headers={"openai-beta": "assistants=v2"},
        )
    got = scripted.received[-1]
    body = got.json()
    assert (body["seed"], body["logit_bias"], body["a_vendor_field"]) == (
        3,
        {"50256": -100},
        {"kept": True},
    )
    assert got.headers["openai-beta"] == "assistants=v2"
    assert GATEWAY_KEY not in str(got.headers)


async def test_a_streamed_answer_names_the_dropped_fields_too(translating) -> None:
    url, scripted = translating
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=GATEWAY_KEY, max_retries=0) as oa:
        raw = await oa.chat.completions.with_raw_response.create(
            model="anthropic/text",
            messages=[{"role": "user", "content": "x"}],
            logprobs=True,
            stream=True,
            extra_headers={"x-tokenwire-drop-params": "true"},
        )
        text = "".join([c.choices[0].delta.content or "" async for c in raw.parse() if c.choices])
    assert raw.headers[DROPPED_HEADER] == "logprobs"
    assert text
    assert "logprobs" not in scripted.received[-1].json()


# -- every entry of every pair ---------------------------------------------------------------

RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}]
_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}
SAMPLES: dict[str, dict[str, Any]] = {
    "openai-chat": {
        "tools": WEATHER_OA,
        "tool_choice": "required",
        "max_tokens": 77,
        "max_completion_tokens": 77,
        "temperature": 0.3,
        "top_p": 0.4,
        "stop": ["Z"],
        "response_format": _SCHEMA_FORMAT,
        "reasoning_effort": "low",
        "parallel_tool_calls": False,
        "user": "u",
        "safety_identifier": "s",
        "metadata": {"k": "v"},
        "seed": 1,
        "store": True,
        "frequency_penalty": 0.1,
        "presence_penalty": 0.2,
        "logit_bias": {"1": 1},
        "logprobs": True,
        "top_logprobs": 2,
        "service_tier": "flex",
        "modalities": ["text"],
        "audio": {"voice": "x"},
        "prediction": {"type": "content", "content": "x"},
        "web_search_options": {"search_context_size": "low"},
        "verbosity": "low",
        "prompt_cache_key": "k",
        "functions": [{"name": "f"}],
        "function_call": "auto",
        "stream": True,
        "stream_options": {"include_usage": True},
        "n": 1,
    },
    "anthropic-messages": {
        "system": "s",
        "tools": WEATHER_AN,
        "tool_choice": {"type": "any"},
        "max_tokens": 77,
        "temperature": 0.3,
        "top_p": 0.4,
        "top_k": 3,
        "stop_sequences": ["Z"],
        "metadata": {"user_id": "u"},
        "thinking": {"type": "enabled", "budget_tokens": 1500},
        "service_tier": "auto",
        "container": "c",
        "stream": True,
        "mcp_servers": [{"type": "url", "url": "http://127.0.0.1:9", "name": "m"}],
        "context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]},
    },
    "openai-responses": {
        "instructions": "s",
        "tools": RESPONSES_TOOLS,
        "tool_choice": "required",
        "max_output_tokens": 77,
        "temperature": 0.3,
        "top_p": 0.4,
        "text": {"format": {"type": "json_schema", "name": "w", "schema": SCHEMA}},
        "reasoning": {"effort": "low"},
        "store": True,
        "include": ["x"],
        "previous_response_id": "r",
        "conversation": "c",
        "prompt": {"id": "p"},
        "truncation": "auto",
        "service_tier": "flex",
        "prompt_cache_key": "k",
        "top_logprobs": 2,
        "background": True,
        "max_tool_calls": 3,
        "stream_options": {"include_obfuscation": False},
        "parallel_tool_calls": False,
        "user": "u",
        "safety_identifier": "s",
        "metadata": {"k": "v"},
        "stream": True,
    },
}
BASES: dict[str, dict[str, Any]] = {
    "openai-chat": {**OA_BASE, "tools": WEATHER_OA},
    "anthropic-messages": {**AN_BASE, "tools": WEATHER_AN},
    "openai-responses": {"model": "x", "input": "hi", "tools": RESPONSES_TOOLS},
}
PSEUDO: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # (with, without): the body holding the entry, and the same body without it
    "tools: server tools": (
        {"tools": [{"type": "web_search_20250305", "name": "web_search"}, *WEATHER_AN]},
        {"tools": WEATHER_AN},
    ),
    "cache_control": (
        {"system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}]},
        {"system": [{"type": "text", "text": "s"}]},
    ),
    "tool_choice.disable_parallel_tool_use": (
        {"tool_choice": {"type": "auto", "disable_parallel_tool_use": True}},
        {"tool_choice": {"type": "auto"}},
    ),
    "tools: built-in tools": (
        {"tools": [{"type": "web_search"}, *RESPONSES_TOOLS]},
        {"tools": RESPONSES_TOOLS},
    ),
}
_STRICT_SCHEMA = {"type": "object", "properties": {}, "additionalProperties": False}
_TOOL_RESULTS = [
    {"role": "user", "content": "go"},
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t", "name": "get_weather", "input": {}}],
    },
    {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x", "is_error": True}],
    },
]
_CHAT_IMAGE = {
    "type": "image_url",
    "image_url": {"url": "https://example.invalid/a.png", "detail": "low"},
}
_RESPONSES_IMAGE = {
    "type": "input_image",
    "image_url": "https://example.invalid/a.png",
    "detail": "low",
}
PSEUDO_OF: dict[tuple[str, str], dict[str, Any]] = {
    # (caller, nested entry): the body holding it; without it is the same body without the key
    ("openai-chat", "messages.name"): {
        "messages": [{"role": "user", "name": "a", "content": "hi"}]
    },
    ("openai-chat", "messages.content.image_url.detail"): {
        "messages": [{"role": "user", "content": [_CHAT_IMAGE]}]
    },
    ("openai-chat", "tools.function.strict"): {
        "tools": [
            {
                "type": "function",
                "function": {"name": "get_weather", "parameters": _STRICT_SCHEMA, "strict": True},
            }
        ]
    },
    ("anthropic-messages", "tools.strict"): {
        "tools": [{"name": "get_weather", "input_schema": _STRICT_SCHEMA, "strict": True}]
    },
    ("anthropic-messages", "messages.content.is_error"): {"messages": _TOOL_RESULTS},
    ("openai-responses", "tools.strict"): {
        "tools": [
            {
                "type": "function",
                "name": "get_weather",
                "parameters": _STRICT_SCHEMA,
                "strict": True,
            }
        ]
    },
    ("openai-responses", "reasoning.summary"): {"reasoning": {"effort": "low", "summary": "auto"}},
    ("openai-responses", "reasoning.generate_summary"): {
        "reasoning": {"effort": "low", "generate_summary": "auto"}
    },
    ("openai-responses", "text.verbosity"): {"text": {"verbosity": "low"}},
    ("openai-responses", "input.content.detail"): {
        "input": [{"role": "user", "content": [_RESPONSES_IMAGE]}]
    },
}


def _without_nested(body: dict[str, Any], entry: str) -> dict[str, Any]:
    """``body`` without the key an entry ``field.[...].key`` names (anywhere in ``field``)."""
    field, key = entry.split(".", 1)[0], entry.rsplit(".", 1)[1]

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != key}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return {k: strip(v) if k == field else v for k, v in body.items()}


NO_EFFECT = {
    "model",
    "messages",
    "input",
    "stream",
    "stream_options",
    "n",
    "reasoning.summary",
    "reasoning.generate_summary",
}
"""Translated entries that change nothing in the provider body by design (docs table)."""
ROUTE_OF = {
    "anthropic-messages": "anthropic/claude",
    "openai-chat": "openai/gpt-4o",
    "openai-responses": "openai-responses/gpt-5",
    "gemini": "gemini/gemini-2.5-flash",
}
ENTRIES = [(pair, field) for pair, table in TABLE.items() for field in table]


def _bodies(caller: str, field: str) -> tuple[dict[str, Any], dict[str, Any]]:
    base = BASES[caller]
    if (caller, field) in PSEUDO_OF:
        with_ = {**base, **PSEUDO_OF[caller, field]}
        return with_, _without_nested(with_, field)
    if field in PSEUDO:
        with_, without = PSEUDO[field]
        return {**base, **with_}, {**base, **without}
    if field in ("model", "messages", "input"):
        return base, base
    with_ = {**base, field: SAMPLES[caller][field]}
    if (caller, field) == ("anthropic-messages", "max_tokens"):  # required: compare values
        return with_, base
    return with_, {k: v for k, v in with_.items() if k != field}


@pytest.mark.parametrize(
    ("pair", "field"), ENTRIES, ids=[f"{p[0]}->{p[1]}:{f}" for p, f in ENTRIES]
)
def test_every_entry_is_seen_translated_or_refused(pair: tuple[str, str], field: str) -> None:
    caller, target = pair
    fate = TABLE[pair][field]
    with_, without = _bodies(caller, field)
    route = ROUTE_OF[target]
    value = with_.get(field)
    refused = fate.kind == "refused" or (
        fate.refused_value is not None and fate.refused_value(value)
    )
    if refused:
        with pytest.raises(UntranslatableFieldError) as info:
            _translated(caller, route, with_)
        assert (info.value.param, info.value.route) == (field, route)
        got, call = _translated(caller, route, with_, **{"x-tokenwire-drop-params": "true"})
        assert call.response_headers == {DROPPED_HEADER: field}
        assert got == _translated(caller, route, without)[0]
        return
    got, call = _translated(caller, route, with_)
    assert call.response_headers == {}
    if field not in NO_EFFECT:  # never silently absent: the field changed the provider body
        assert got != _translated(caller, route, without)[0], fate.how


def test_the_drop_settings_reach_the_gateway_from_the_environment() -> None:
    from tokenwire.services.gateway import GatewaySettings
    from tokenwire.services.gateway._dialects.translation import wants_drop

    env = GatewaySettings.from_env(
        {"TOKENWIRE_GEMINI_DROP_PARAMS": "true", "TOKENWIRE_NATS_URL": "nats://127.0.0.1:1"}
    ).provider_env
    assert wants_drop({}, env, "gemini")
    assert not wants_drop({}, env, "anthropic")
    everywhere = GatewaySettings.from_env({"TOKENWIRE_GATEWAY_DROP_PARAMS": "1"}).provider_env
    assert wants_drop({}, everywhere, "anthropic")
