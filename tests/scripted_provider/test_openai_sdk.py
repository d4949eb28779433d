"""The official ``openai`` SDK streams every OpenAI-dialect scenario over a real socket and its
own accumulation equals ``expected_outcome`` (the SDK is the oracle of the wire format)."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.scripted_provider._oracles import Seen, from_openai
from tokenwire.services.scripted_provider import ExpectedStep, ScriptedSettings, expected_outcome

USER = [{"role": "user", "content": "What is the weather?"}]


def request(
    model: str, *, stream: bool = True, messages: Any = None, **extra: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": messages or USER, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body | extra


async def stream_seen(client: openai.AsyncOpenAI, body: dict[str, Any], **kwargs: Any) -> Seen:
    """Stream with the SDK's helper and take its accumulated snapshot.

    The snapshot, not ``get_final_completion()``, because the helper refuses to finalise a
    ``length`` finish (``LengthFinishReasonError``), which is the max-tokens scenario.
    """
    args = {k: v for k, v in body.items() if k != "stream"}
    async with client.chat.completions.stream(**args, **kwargs) as stream:
        async for _ in stream:
            pass
        return from_openai(stream.current_completion_snapshot)


def assert_matches(seen: Seen, expected: ExpectedStep) -> None:
    assert seen.text == expected.text
    assert seen.reasoning == expected.reasoning
    assert seen.tool_calls == expected.tool_calls + expected.dropped_tool_calls
    assert seen.finish_reason == expected.finish_reason
    assert seen.usage == expected.usage


@pytest.mark.parametrize("scenario", ["text", "reasoning", "tools", "max-tokens"])
async def test_stream_accumulates_to_expected(
    openai_client: openai.AsyncOpenAI, settings: ScriptedSettings, scenario: str
) -> None:
    body = request(f"scripted/{scenario}")
    seen = await stream_seen(openai_client, body)
    assert_matches(seen, expected_outcome(scenario, body, settings))


@pytest.mark.parametrize("scenario", ["text", "reasoning", "tools", "max-tokens"])
async def test_non_streaming_completion_matches_expected(
    openai_client: openai.AsyncOpenAI, settings: ScriptedSettings, scenario: str
) -> None:
    body = request(scenario, stream=False)
    completion = await openai_client.chat.completions.create(**body)
    assert completion.object == "chat.completion"
    assert_matches(from_openai(completion), expected_outcome(scenario, body, settings))


async def test_expected_text_is_nontrivial(settings: ScriptedSettings) -> None:
    # Guards the comparisons above against an expectation that is trivially empty.
    step = expected_outcome("reasoning", request("reasoning"), settings)
    assert settings.sentinel_tag in step.text
    assert settings.sentinel_tag in step.reasoning
    assert step.fragments.text == settings.length
    assert step.message is not None
    assert step.message.text == step.text


async def test_tools_names_come_from_the_request(
    openai_client: openai.AsyncOpenAI, settings: ScriptedSettings
) -> None:
    tools = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in ("lookup", "fetch")
    ]
    body = request("tools", tools=tools)
    seen = await stream_seen(openai_client, body)
    assert [c.name for c in seen.tool_calls] == ["lookup", "fetch"]
    assert_matches(seen, expected_outcome("tools", body, settings))


async def test_tools_step_after_tool_results_answers_with_text(
    openai_client: openai.AsyncOpenAI, settings: ScriptedSettings
) -> None:
    first_body = request("scripted/tools")
    first = await stream_seen(openai_client, first_body)
    assert first.finish_reason == "tool-calls"
    calls = [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in first.tool_calls
    ]
    results = [{"role": "tool", "tool_call_id": c.id, "content": "21 C"} for c in first.tool_calls]
    history = [*USER, {"role": "assistant", "content": None, "tool_calls": calls}, *results]
    body = request("scripted/tools", messages=history)
    seen = await stream_seen(openai_client, body)
    expected = expected_outcome("tools", body, settings)
    assert expected.finish_reason == "stop"
    assert expected.text
    assert_matches(seen, expected)


async def test_header_overrides_length_and_fragment_size(
    openai_client: openai.AsyncOpenAI, settings: ScriptedSettings
) -> None:
    headers = {"X-Scripted-Fragments": "2000", "X-Scripted-Fragment-Size": "1"}
    body = request("text")
    seen = await stream_seen(openai_client, body, extra_headers=headers)
    expected = expected_outcome("text", body, settings, headers=headers)
    assert expected.fragments.text == 2000
    assert_matches(seen, expected)


async def test_model_options_override_length(
    openai_client: openai.AsyncOpenAI, settings: ScriptedSettings
) -> None:
    body = request("scripted/text?fragments=1&size=64")
    seen = await stream_seen(openai_client, body)
    expected = expected_outcome("text", body, settings)
    assert expected.fragments.text == 1
    assert_matches(seen, expected)


async def test_session_header_changes_the_content(
    openai_client: openai.AsyncOpenAI, settings: ScriptedSettings
) -> None:
    body = request("text")
    seen = {
        session: await stream_seen(
            openai_client, body, extra_headers={"X-Tokenwire-Session": session}
        )
        for session in ("s-1", "s-2")
    }
    for session, got in seen.items():
        headers = {"X-Tokenwire-Session": session}
        assert got.text == expected_outcome("text", body, settings, headers=headers).text
    assert seen["s-1"].text != seen["s-2"].text


async def test_without_include_usage_no_usage_is_sent(
    openai_client: openai.AsyncOpenAI, settings: ScriptedSettings
) -> None:
    body: dict[str, Any] = {"model": "text", "messages": USER, "stream": True}
    chunks = [c async for c in await openai_client.chat.completions.create(**body)]
    assert all(c.usage is None for c in chunks)
    assert expected_outcome("text", body, settings).usage is None
