"""The official ``anthropic`` SDK streams the Anthropic-dialect scenarios over a real socket and
``get_final_message()`` equals ``expected_outcome``."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from tests.scripted_provider._oracles import Seen, from_anthropic
from tokenwire.schemas import ToolCallBlock
from tokenwire.services.scripted_provider import ExpectedStep, ScriptedSettings, expected_outcome

USER = [{"role": "user", "content": "What is the weather?"}]


def request(
    model: str, *, stream: bool = True, messages: Any = None, **extra: Any
) -> dict[str, Any]:
    body = {"model": model, "max_tokens": 1024, "messages": messages or USER, "stream": stream}
    return body | extra


async def stream_seen(
    client: anthropic.AsyncAnthropic, body: dict[str, Any], **kwargs: Any
) -> Seen:
    """Stream with the SDK's helper; tool inputs as the raw JSON the SDK saw streamed."""
    args = {k: v for k, v in body.items() if k != "stream"}
    raw: dict[int, str] = {}
    async with client.messages.stream(**args, **kwargs) as stream:
        async for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                raw[event.index] = raw.get(event.index, "") + event.delta.partial_json
        return from_anthropic(await stream.get_final_message(), raw)


def parsed_calls(calls: list[ToolCallBlock]) -> list[tuple[str, str, Any]]:
    return [(c.id, c.name, json.loads(c.arguments)) for c in calls]


def assert_matches(seen: Seen, expected: ExpectedStep, *, raw_arguments: bool = True) -> None:
    """Streams are compared on the raw argument strings; whole messages carry parsed inputs."""
    assert seen.text == expected.text
    assert seen.reasoning == expected.reasoning
    assert seen.signature == expected.signature
    calls = expected.tool_calls + expected.dropped_tool_calls
    if raw_arguments:
        assert seen.tool_calls == calls
    else:
        assert parsed_calls(seen.tool_calls) == parsed_calls(calls)
    assert seen.finish_reason == expected.finish_reason
    assert seen.usage == expected.usage


@pytest.mark.parametrize("scenario", ["text", "reasoning", "tools", "max-tokens"])
async def test_stream_final_message_equals_expected(
    anthropic_client: anthropic.AsyncAnthropic, settings: ScriptedSettings, scenario: str
) -> None:
    body = request(f"scripted/{scenario}")
    seen = await stream_seen(anthropic_client, body)
    assert_matches(seen, expected_outcome(scenario, body, settings, dialect="anthropic"))


@pytest.mark.parametrize("scenario", ["text", "reasoning", "tools", "max-tokens"])
async def test_non_streaming_message_equals_expected(
    anthropic_client: anthropic.AsyncAnthropic, settings: ScriptedSettings, scenario: str
) -> None:
    body = request(scenario, stream=False)
    message = await anthropic_client.messages.create(**body)
    expected = expected_outcome(scenario, body, settings, dialect="anthropic")
    assert_matches(from_anthropic(message), expected, raw_arguments=False)


async def test_stream_tool_inputs_parse_to_the_final_message_inputs(
    anthropic_client: anthropic.AsyncAnthropic, settings: ScriptedSettings
) -> None:
    body = request("tools")
    async with anthropic_client.messages.stream(
        **{k: v for k, v in body.items() if k != "stream"}
    ) as s:
        final = await s.get_final_message()
    expected = expected_outcome("tools", body, settings, dialect="anthropic")
    inputs = [b.input for b in final.content if b.type == "tool_use"]
    assert inputs == [json.loads(c.arguments) for c in expected.tool_calls]
    assert all(c.id.startswith("toolu_") for c in expected.tool_calls)


async def test_tools_step_after_tool_result_answers_with_text(
    anthropic_client: anthropic.AsyncAnthropic, settings: ScriptedSettings
) -> None:
    first = await stream_seen(anthropic_client, request("tools"))
    uses = [
        {"type": "tool_use", "id": c.id, "name": c.name, "input": json.loads(c.arguments)}
        for c in first.tool_calls
    ]
    results = [
        {"type": "tool_result", "tool_use_id": c.id, "content": "21 C"} for c in first.tool_calls
    ]
    history = [*USER, {"role": "assistant", "content": uses}, {"role": "user", "content": results}]
    body = request("tools", messages=history)
    seen = await stream_seen(anthropic_client, body)
    expected = expected_outcome("tools", body, settings, dialect="anthropic")
    assert expected.finish_reason == "stop"
    assert_matches(seen, expected)
