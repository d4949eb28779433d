"""No request is changed silently: nested fields and folded answers.

Each case sends a body through the in-process gateway (ASGI, canned provider answers) and
looks at what the provider received and what the caller got back. The oracle is the field as
the caller sent it (and, for a carried field, its documented name in the provider's API): it
reaches the provider, or the caller gets a 400 in its own dialect naming the field, or, with
``x-tokenwire-drop-params: true``, it is gone from the provider body and listed in
``x-tokenwire-dropped-params``.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest

from tests.gateway._helpers import GATEWAY_KEY, Rig, make_rig, provider_env, recording
from tokenwire.providers import Dialect
from tokenwire.services.gateway._routing.routing import Route

DROP = {"x-tokenwire-drop-params": "true"}
DROPPED = "x-tokenwire-dropped-params"
ANSWERS = {
    Dialect.OPENAI_CHAT: "openai/chat-text-include-usage.sse",
    Dialect.ANTHROPIC_MESSAGES: "anthropic/messages-text-short.sse",
    Dialect.OPENAI_RESPONSES: "openai-responses/responses-text.sse",
    Dialect.GEMINI: "google/gemini-stream-text.sse",
}
PATHS = {
    "chat": "/v1/chat/completions",
    "anthropic": "/v1/messages",
    "responses": "/v1/responses",
}
MODELS = {
    "chat": "openai/gpt-4o",
    "anthropic": "anthropic/claude",
    "responses": "openai-responses/gpt-5",
    "gemini": "gemini/gemini-2.5-flash",
}
BASES: dict[str, dict[str, Any]] = {
    "chat": {"messages": [{"role": "user", "content": "hi"}]},
    "anthropic": {"max_tokens": 2048, "messages": [{"role": "user", "content": "hi"}]},
    "responses": {"input": "hi"},
}


def _answer(route: Route, body: bytes) -> bytes:
    return recording(ANSWERS[route.dialect])


def _rig(answer: bytes | None = None) -> Rig:
    env = provider_env(GEMINI_API_KEY="gm-key")
    return make_rig(answer if answer is not None else _answer, provider_env=env)


class Sent:
    """One call: the caller's status, body and headers, and what the provider received."""

    def __init__(self, status: int, body: Any, headers: Any, provider: dict[str, Any] | None):
        self.status, self.body, self.headers, self.provider = status, body, headers, provider

    def refused_naming(self, caller: str, field: str) -> bool:
        """A 400 in the caller's dialect that names ``field`` (OpenAI: as ``param``)."""
        if self.status != 400 or self.provider is not None:
            return False
        if caller == "anthropic":
            error = self.body["error"]
            return bool(self.body["type"] == "error" and field in error["message"])
        return bool(self.body["error"]["param"] == field)


async def send(caller: str, target: str, extra: dict[str, Any], **headers: str) -> Sent:
    rig = _rig()
    body = {"model": MODELS[target], **copy.deepcopy(BASES[caller]), **copy.deepcopy(extra)}
    async with rig.client(authorization=f"Bearer {GATEWAY_KEY}", **headers) as client:
        response = await client.post(PATHS[caller], json=body)
    provider = msgspec.json.decode(rig.upstream.requests[0][1]) if rig.upstream.requests else None
    json_body = response.headers["content-type"].startswith("application/json")
    answer = response.json() if json_body else response.text
    return Sent(response.status_code, answer, response.headers, provider)


def _tools_of(target: str, provider: dict[str, Any]) -> list[dict[str, Any]]:
    """The tool definitions in a provider body, in the provider's documented shape."""
    if target == "gemini":
        return list(provider["tools"][0]["functionDeclarations"])
    if target == "chat":
        return [t["function"] for t in provider["tools"]]
    return list(provider["tools"])


# -- a strict tool stays strict ---------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {}, "additionalProperties": False}
STRICT_TOOLS: dict[str, tuple[dict[str, Any], str]] = {
    # caller: (the body's strict tools, the entry naming the flag)
    "chat": (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": SCHEMA, "strict": True},
                }
            ]
        },
        "tools.function.strict",
    ),
    "anthropic": (
        {"tools": [{"name": "f", "input_schema": SCHEMA, "strict": True}]},
        "tools.strict",
    ),
    "responses": (
        {"tools": [{"type": "function", "name": "f", "parameters": SCHEMA, "strict": True}]},
        "tools.strict",
    ),
}
CARRIED = [
    (caller, target)
    for caller in STRICT_TOOLS
    for target in ("chat", "anthropic", "responses")
    if target != caller
]


@pytest.mark.parametrize(("caller", "target"), CARRIED)
async def test_a_strict_tool_reaches_the_provider_strict(caller: str, target: str) -> None:
    """``strict: true`` is a documented tool field in Chat (``function.strict``), Responses
    and Anthropic alike; it was lost (and sent as ``strict: false`` to Responses)."""
    extra, _ = STRICT_TOOLS[caller]
    got = await send(caller, target, extra)
    assert got.status == 200, got.body
    assert got.provider is not None
    assert [t.get("strict") for t in _tools_of(target, got.provider)] == [True]
    assert DROPPED not in got.headers


@pytest.mark.parametrize("caller", sorted(STRICT_TOOLS))
async def test_a_strict_tool_toward_gemini_is_refused_or_dropped_on_opt_in(caller: str) -> None:
    """Gemini's function declarations have no strict mode."""
    extra, entry = STRICT_TOOLS[caller]
    got = await send(caller, "gemini", extra)
    assert got.refused_naming(caller, entry), got.body
    dropped = await send(caller, "gemini", extra, **DROP)
    assert dropped.status == 200, dropped.body
    assert dropped.headers[DROPPED] == entry
    assert dropped.provider is not None
    assert [t["name"] for t in _tools_of("gemini", dropped.provider)] == ["f"]


async def test_a_non_strict_tool_stays_non_strict_toward_responses() -> None:
    got = await send(
        "chat",
        "responses",
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}]},
    )
    assert got.provider is not None
    assert got.provider["tools"][0]["strict"] is False


# -- nested fields that were silently left out --------------------------------------------------

IMAGE = "https://example.invalid/cat.png"
REFUSED: list[tuple[str, str, dict[str, Any], str]] = [
    # (caller, target, extra body, the entry named)
    *[
        (
            "chat",
            target,
            {"messages": [{"role": "user", "name": "alice", "content": "hi"}]},
            "messages.name",
        )
        for target in ("anthropic", "responses", "gemini")
    ],
    *[
        (
            "chat",
            target,
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": IMAGE, "detail": "low"}}
                        ],
                    }
                ]
            },
            "messages.content.image_url.detail",
        )
        for target in ("anthropic", "responses", "gemini")
    ],
    (
        "chat",
        "anthropic",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}
                    ],
                }
            ]
        },
        "messages.content.cache_control",
    ),
    (
        "chat",
        "anthropic",
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "w", "description": "the weather now", "schema": SCHEMA},
            }
        },
        "response_format.json_schema.description",
    ),
    ("chat", "anthropic", {"user": "u-1", "safety_identifier": "s-1"}, "safety_identifier"),
    ("responses", "chat", {"user": "u-1", "safety_identifier": "s-1"}, "safety_identifier"),
    ("responses", "anthropic", {"user": "u-1", "safety_identifier": "s-1"}, "safety_identifier"),
    *[
        ("responses", target, {"text": {"verbosity": "low"}}, "text.verbosity")
        for target in ("chat", "anthropic", "gemini")
    ],
    ("responses", "anthropic", {"reasoning": {"effort": "low", "mode": "pro"}}, "reasoning.mode"),
    (
        "responses",
        "chat",
        {
            "input": [
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": IMAGE, "detail": "high"}],
                }
            ]
        },
        "input.content.detail",
    ),
    (
        "responses",
        "chat",
        {
            "tools": [
                {
                    "type": "function",
                    "name": "f",
                    "parameters": SCHEMA,
                    "strict": False,
                    "output_schema": SCHEMA,
                }
            ]
        },
        "tools.output_schema",
    ),
    *[
        (
            "anthropic",
            target,
            {
                "messages": [
                    {"role": "user", "content": "go"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
                    },
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t1",
                                "content": "boom",
                                "is_error": True,
                            }
                        ],
                    },
                ]
            },
            "messages.content.is_error",
        )
        for target in ("chat", "responses")
    ],
    (
        "anthropic",
        "chat",
        {"tools": [{"name": "f", "input_schema": SCHEMA, "input_examples": [{"city": "Oslo"}]}]},
        "tools.input_examples",
    ),
    (
        "anthropic",
        "gemini",
        {"thinking": {"type": "enabled", "budget_tokens": 2000, "display": "omitted"}},
        "thinking.display",
    ),
]


@pytest.mark.parametrize(
    ("caller", "target", "extra", "entry"),
    REFUSED,
    ids=[f"{c}->{t}:{e}" for c, t, _, e in REFUSED],
)
async def test_a_nested_field_without_counterpart_is_refused_then_dropped_on_opt_in(
    caller: str, target: str, extra: dict[str, Any], entry: str
) -> None:
    got = await send(caller, target, extra)
    assert got.refused_naming(caller, entry), (got.status, got.body, got.provider)
    dropped = await send(caller, target, extra, **DROP)
    assert dropped.status == 200, dropped.body
    assert dropped.headers[DROPPED] == entry
    key = entry.rsplit(".", 1)[-1]
    assert f'"{key}"' not in msgspec.json.encode(dropped.provider).decode()


async def test_the_same_value_in_user_and_safety_identifier_is_one_id() -> None:
    got = await send("chat", "anthropic", {"user": "u-1", "safety_identifier": "u-1"})
    assert got.provider is not None
    assert got.provider["metadata"] == {"user_id": "u-1"}


async def test_image_detail_auto_asks_for_nothing() -> None:
    got = await send(
        "chat",
        "anthropic",
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": IMAGE, "detail": "auto"}}
                    ],
                }
            ]
        },
    )
    assert got.provider is not None
    assert got.provider["messages"][0]["content"] == [
        {"type": "image", "source": {"type": "url", "url": IMAGE}}
    ]


async def test_an_error_tool_result_is_carried_to_gemini() -> None:
    got = await send(
        "anthropic",
        "gemini",
        {
            "messages": [
                {"role": "user", "content": "go"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": "boom",
                            "is_error": True,
                        }
                    ],
                },
            ]
        },
    )
    assert got.provider is not None
    result = got.provider["contents"][-1]["parts"][0]["functionResponse"]
    assert result == {"name": "f", "response": {"error": "boom"}}


async def test_a_reasoning_summary_request_is_read_not_refused() -> None:
    got = await send("responses", "anthropic", {"reasoning": {"effort": "low", "summary": "auto"}})
    assert got.status == 200, got.body
    assert got.provider is not None
    assert got.provider["thinking"] == {"type": "enabled", "budget_tokens": 1024}


@pytest.mark.parametrize("target", ["chat", "responses", "gemini"])
async def test_an_anthropic_image_from_the_files_api_is_a_400_not_an_empty_image(
    target: str,
) -> None:
    """A ``file`` source has neither data nor url: it was sent as ``data:image/*;base64,None``
    (OpenAI) or ``inlineData.data: null`` (Gemini)."""
    got = await send(
        "anthropic",
        target,
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image", "source": {"type": "file", "file_id": "file_011"}}
                    ],
                }
            ]
        },
    )
    assert got.status == 400
    assert got.provider is None
    assert "file" in got.body["error"]["message"]


async def test_a_forced_tool_choice_without_tools_is_not_dropped_toward_anthropic() -> None:
    """OpenAI refuses ``tool_choice: required`` without tools; the translation used to leave
    it out and answer in text."""
    got = await send("chat", "anthropic", {"tool_choice": "required"})
    assert got.refused_naming("chat", "tool_choice"), got.body


async def test_a_dropped_field_is_listed_once() -> None:
    extra = {
        "cache_control": {"type": "ephemeral"},
        "system": [{"type": "text", "text": "s", "cache_control": {"type": "ephemeral"}}],
    }
    got = await send("anthropic", "chat", extra, **DROP)
    assert got.status == 200, got.body
    assert got.headers[DROPPED] == "cache_control"
    assert got.provider is not None
    assert "cache_control" not in msgspec.json.encode(got.provider).decode()


# -- what a folded (non-streaming) answer cannot carry ------------------------------------------


def _chunk(delta: dict[str, Any], logprobs: Any, finish: str | None = None) -> str:
    choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o",
        "choices": [choice],
    }
    return "data: " + msgspec.json.encode(body).decode() + "\n\n"


TOKEN = {"token": "Hi", "logprob": -0.25, "bytes": [72, 105], "top_logprobs": []}
LOGPROBS_STREAM = (
    _chunk({"role": "assistant", "content": ""}, {"content": [], "refusal": None})
    + _chunk({"content": "Hi"}, {"content": [TOKEN], "refusal": None})
    + _chunk({}, None, "stop")
    + "data: [DONE]\n\n"
).encode()
"""An OpenAI stream with logprobs, as OpenAI documents the chunk's ``choices[].logprobs``."""


async def test_non_streaming_logprobs_are_never_answered_null() -> None:
    """Same dialect, non-streaming: the answer is folded from the stream and has no place for
    logprobs, so ``logprobs: true`` was answered ``"logprobs": null`` with a 200. Carrying
    them would be the other faithful answer; the gateway refuses."""
    rig = _rig(LOGPROBS_STREAM)
    body = {
        "model": "openai/gpt-4o",
        "messages": [{"role": "user", "content": "hi"}],
        "logprobs": True,
        "top_logprobs": 2,
    }
    async with rig.client(authorization=f"Bearer {GATEWAY_KEY}") as client:
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 400, response.json()
        assert response.json()["error"]["param"] == "logprobs"
        assert rig.upstream.requests == []
        dropped = await client.post("/v1/chat/completions", json=body, headers=DROP)
    assert dropped.status_code == 200
    assert dropped.headers[DROPPED] == "logprobs,top_logprobs"
    sent = msgspec.json.decode(rig.upstream.requests[0][1])
    assert "logprobs" not in sent
    assert "top_logprobs" not in sent


FOLDED_CASES = [
    (
        "chat",
        {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}},
        "modalities,audio",
    ),
    ("chat", {"logprobs": False}, None),  # asks for nothing
    ("responses", {"include": ["reasoning.encrypted_content"]}, "include"),
    ("responses", {"top_logprobs": 3}, "top_logprobs"),
]


@pytest.mark.parametrize(("caller", "extra", "dropped"), FOLDED_CASES)
async def test_what_a_folded_answer_cannot_carry_is_refused_for_non_streaming_callers(
    caller: str, extra: dict[str, Any], dropped: str | None
) -> None:
    got = await send(caller, caller, extra)
    if dropped is None:
        assert got.status == 200, got.body
        return
    assert got.refused_naming(caller, dropped.split(",")[0]), got.body
    opted = await send(caller, caller, extra, **DROP)
    assert opted.status == 200, opted.body
    assert opted.headers[DROPPED] == dropped
    assert opted.provider is not None
    assert not set(dropped.split(",")) & set(opted.provider)
    streamed = await send(caller, caller, {**extra, "stream": True})
    assert streamed.status == 200  # a streaming caller gets the provider's events as sent
    assert streamed.provider is not None
    assert {k: streamed.provider[k] for k in extra} == extra


async def test_streaming_logprobs_are_forwarded_as_sent() -> None:
    rig = _rig(LOGPROBS_STREAM)
    body = {
        "model": "openai/gpt-4o",
        "messages": [{"role": "user", "content": "hi"}],
        "logprobs": True,
        "stream": True,
    }
    async with rig.client(authorization=f"Bearer {GATEWAY_KEY}") as client:
        response = await client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert msgspec.json.encode(TOKEN) in response.content
    assert msgspec.json.decode(rig.upstream.requests[0][1])["logprobs"] is True
