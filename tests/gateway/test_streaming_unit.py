"""The gateway in process on fakes: streaming and non-streaming, same dialect and translated.

Expected values come from the official SDKs parsing the recorded provider bodies directly
(the oracles in ``_helpers``), and from the provider normalisers run on the same recording.
"""

from __future__ import annotations

import json

import msgspec
from anthropic.types import MessageParam
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolUnionParam

from tests.gateway._helpers import (
    GATEWAY_KEY,
    anthropic_oracle,
    collect_openai,
    make_rig,
    openai_oracle,
    recording,
    text_of,
    tool_uses,
)
from tokenwire.providers import AnthropicNormaliser, Normaliser, OpenAIChatNormaliser
from tokenwire.schemas import Finish, StreamChunk
from tokenwire.sse import SseParser

USER = [{"role": "user", "content": "hi"}]
# The same message, typed for each SDK's ``create``.
OA_USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
AN_USER: list[MessageParam] = [{"role": "user", "content": "hi"}]


def normalised(body: bytes, normaliser: Normaliser) -> list[StreamChunk]:
    parser = SseParser()
    out = [c for e in parser.feed(body) + parser.close() for c in normaliser.feed(e)]
    return out + normaliser.close()


def assert_published_step(rig, expected_chunks, provider: str, model: str) -> None:
    envs = rig.envelopes()
    assert [e.chunk for e in envs] == expected_chunks
    assert [e.ordinal for e in envs] == list(range(len(envs)))
    assert [m.first for m in rig.sink.messages] == [True] + [False] * (len(envs) - 1)
    assert {(e.session, e.turn, e.step, e.provider, e.model) for e in envs} == {
        (envs[0].session, 0, 0, provider, model)
    }
    assert envs[0].request_time_ns is not None
    assert all(e.request_time_ns is None for e in envs[1:])
    assert all(e.time_ns >= envs[0].request_time_ns for e in envs)


async def test_openai_passthrough_stream_matches_the_provider_and_strips_added_usage():
    body = recording("openai/chat-parallel-tool-calls-fragmented-usage.sse")
    rig = make_rig(body)
    stream = await rig.openai().chat.completions.create(
        model="openai/gpt-4o", messages=OA_USER, stream=True
    )
    got = await collect_openai(stream)
    want = await openai_oracle(body)
    assert got["tool_calls"] == want["tool_calls"]
    assert len(got["tool_calls"]) == 2
    assert got["finish"] == want["finish"] == "tool_calls"
    assert got["usage"] is None  # the caller did not ask for it; the gateway did
    sent = json.loads(rig.upstream.requests[0][1])
    assert sent["model"] == "gpt-4o"
    assert sent["stream_options"] == {"include_usage": True}
    assert rig.upstream.requests[0][0].url == "https://api.openai.com/v1/chat/completions"
    assert_published_step(rig, normalised(body, OpenAIChatNormaliser()), "openai", "gpt-4o")
    assert any(type(e.chunk).__name__ == "Usage" for e in rig.envelopes())


async def test_openai_passthrough_keeps_usage_when_asked_and_ends_with_done():
    body = recording("openai/chat-text-include-usage.sse")
    rig = make_rig(body)
    async with rig.client(authorization=f"Bearer {GATEWAY_KEY}") as client:
        request = {"model": "openai/gpt-4o", "messages": USER, "stream": True}
        request["stream_options"] = {"include_usage": True}
        response = await client.post("/v1/chat/completions", json=request)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.text.endswith("data: [DONE]\n\n")
    want = await openai_oracle(body)
    got = await openai_oracle(response.content)
    assert got["text"] == want["text"]
    assert got["usage"] == want["usage"] is not None
    assert response.headers["x-tokenwire-session"] == rig.ids[0]
    assert (response.headers["x-tokenwire-turn"], response.headers["x-tokenwire-step"]) == (
        "0",
        "0",
    )


async def test_openai_non_streaming_is_served_from_a_streamed_call():
    body = recording("openai/chat-text-include-usage.sse")
    rig = make_rig(body)
    completion = await rig.openai().chat.completions.create(model="openai/gpt-4o", messages=OA_USER)
    want = await openai_oracle(body)
    assert completion.choices[0].message.content == want["text"]
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == want["usage"].prompt_tokens
    assert completion.usage.completion_tokens == want["usage"].completion_tokens
    assert json.loads(rig.upstream.requests[0][1])["stream"] is True
    assert isinstance(rig.envelopes()[-1].chunk, Finish)


async def test_anthropic_passthrough_stream_matches_the_provider():
    body = recording("anthropic/messages-two-tool-uses-input-json-delta.sse")
    rig = make_rig(body)
    async with rig.anthropic().messages.stream(
        model="anthropic/claude-sonnet-4-5", max_tokens=100, messages=AN_USER
    ) as stream:
        got = await stream.get_final_message()
    want = await anthropic_oracle(body)
    assert tool_uses(got) == tool_uses(want)
    assert len(tool_uses(got)) >= 1
    assert text_of(got) == text_of(want)
    assert got.stop_reason == want.stop_reason
    route, sent = rig.upstream.requests[0]
    assert route.url == "https://api.anthropic.com/v1/messages"
    assert json.loads(sent)["model"] == "claude-sonnet-4-5"
    expected = normalised(body, AnthropicNormaliser())
    assert_published_step(rig, expected, "anthropic", "claude-sonnet-4-5")


async def test_anthropic_non_streaming_message():
    body = recording("anthropic/messages-thinking-then-text.sse")
    rig = make_rig(body)
    got = await rig.anthropic().messages.create(
        model="anthropic/claude-sonnet-4-5", max_tokens=100, messages=AN_USER
    )
    want = await anthropic_oracle(body)
    assert text_of(got) == text_of(want)
    assert [b.type for b in got.content] == [b.type for b in want.content]
    assert got.usage.output_tokens == want.usage.output_tokens


async def test_openai_caller_to_anthropic_provider_is_translated():
    body = recording("anthropic/messages-two-tool-uses-input-json-delta.sse")
    rig = make_rig(body)
    tools: list[ChatCompletionToolUnionParam] = [
        {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
    ]
    stream = await rig.openai().chat.completions.create(
        model="anthropic/claude-sonnet-4-5",
        messages=[{"role": "system", "content": "be brief"}, *OA_USER],
        tools=tools,
        max_tokens=50,
        stream=True,
        stream_options={"include_usage": True},
    )
    got = await collect_openai(stream)
    want = await anthropic_oracle(body)
    assert got["text"] == text_of(want)
    assert [
        (c["id"], c["name"], json.loads(c["arguments"] or "{}")) for c in got["tool_calls"]
    ] == (tool_uses(want))
    assert got["finish"] == "tool_calls"
    assert got["usage"].completion_tokens == want.usage.output_tokens
    sent = json.loads(rig.upstream.requests[0][1])
    assert sent["system"] == "be brief"
    assert sent["max_tokens"] == 50
    assert sent["stream"] is True
    assert sent["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert sent["tools"] == [
        {"name": "get_weather", "input_schema": {"type": "object", "properties": {}}}
    ]


async def test_anthropic_caller_to_openai_provider_is_translated():
    body = recording("openai/chat-parallel-tool-calls-fragmented-usage.sse")
    rig = make_rig(body)
    async with rig.anthropic().messages.stream(
        model="openai/gpt-4o", max_tokens=100, messages=AN_USER, system="sys"
    ) as stream:
        got = await stream.get_final_message()
    want = await openai_oracle(body)
    assert [(i, n, json.dumps(a, separators=(",", ":"))) for i, n, a in tool_uses(got)] == [
        (c["id"], c["name"], json.dumps(json.loads(c["arguments"]), separators=(",", ":")))
        for c in want["tool_calls"]
    ]
    assert got.stop_reason == "tool_use"
    sent = json.loads(rig.upstream.requests[0][1])
    assert sent["messages"][0] == {"role": "system", "content": "sys"}
    assert sent["max_completion_tokens"] == 100
    assert sent["stream_options"] == {"include_usage": True}


async def test_anthropic_caller_non_streaming_from_openai_text():
    body = recording("openai/chat-text-include-usage.sse")
    rig = make_rig(body)
    got = await rig.anthropic().messages.create(
        model="openai/gpt-4o", max_tokens=10, messages=AN_USER
    )
    want = await openai_oracle(body)
    assert text_of(got) == want["text"]
    assert got.stop_reason == "end_turn"
    assert got.usage.input_tokens == want["usage"].prompt_tokens  # no cache reads recorded


async def test_tool_round_trip_translation_to_anthropic_keeps_ids_and_arguments():
    rig = make_rig(recording("anthropic/messages-text-short.sse"))
    messages = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "w", "arguments": '{"c":"Paris"}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "w", "arguments": '{"c":"Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_2", "content": "rain"},
    ]
    async with rig.client(authorization=f"Bearer {GATEWAY_KEY}") as client:
        response = await client.post(
            "/v1/chat/completions", json={"model": "anthropic/c", "messages": messages}
        )
    assert response.status_code == 200, response.text
    sent = msgspec.json.decode(rig.upstream.requests[0][1])
    assert sent["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "call_1", "name": "w", "input": {"c": "Paris"}},
                {"type": "tool_use", "id": "call_2", "name": "w", "input": {"c": "Rome"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_1",
                    "content": "sunny",
                    "is_error": False,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "call_2",
                    "content": "rain",
                    "is_error": False,
                },
            ],
        },
    ]
    # a tool result continues the turn: the next step of turn 0 (no earlier step existed)
    assert response.headers["x-tokenwire-turn"] == "0"
