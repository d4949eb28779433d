"""Every SDK of the dev group keeps an unmodified tool loop in one session, with no tokenwire
header: the anthropic SDK (``/v1/messages``), the openai SDK's Responses API (``/v1/responses``,
matched by the call ids it sends back, and by ``previous_response_id``), LangChain's
``ChatOpenAI`` and the openai npm package driving the gateway from Node. (The OpenAI Agents
SDK: tests/gateway/test_agents_sdk.py.)

Ground truth: the session each request reached, as the scripted provider received it (the
gateway sends it ``X-Tokenwire-Session``), and the steps' first chunks on the broker.
LangChain is imported where it is used: every pytest worker collects this module, and only the
one that runs it pays for LangChain (ADR 0038).
"""

from __future__ import annotations

from typing import Any

import anthropic
import openai
import pytest

from tests.fixtures.recordings import recordings_dir
from tests.gateway._helpers import GATEWAY_KEY
from tests.gateway._recorded_upstream import recorded_upstream
from tests.gateway._threading_rig import Stack, threading_stack
from tokenwire.schemas import StepLink


@pytest.fixture
async def stack(nats_url, nc, topology):
    async with threading_stack(nats_url, nc, topology) as rig:
        yield rig


def _sessions(stack: Stack, since: int) -> list[str]:
    return [r.headers["x-tokenwire-session"] for r in list(stack.scripted.received)[since:]]


async def _one_session_of_two_steps(stack: Stack, since: int) -> str:
    """The loop's two provider calls went to one session, whose step 1 names step 0."""
    first, second = _sessions(stack, since)
    assert first == second
    assert await stack.parents(first) == {(0, 0): None, (0, 1): StepLink(first, 0, 0)}
    return first


@pytest.mark.parametrize("stream", [False, True], ids=["folded", "streamed"])
async def test_the_anthropic_sdk_tool_loop_is_one_session(stack: Stack, stream: bool) -> None:
    client = anthropic.AsyncAnthropic(base_url=stack.urls[0], api_key=GATEWAY_KEY, max_retries=0)
    tools: list[Any] = [{"name": "lookup", "input_schema": {"type": "object", "properties": {}}}]
    since = len(stack.scripted.received)
    messages: list[Any] = [{"role": "user", "content": "look it up"}]
    asked: Any
    if stream:
        async with client.messages.stream(
            model="scripted/tools", max_tokens=256, messages=messages, tools=tools
        ) as running:
            asked = await running.get_final_message()
    else:
        asked = await client.messages.create(
            model="scripted/tools", max_tokens=256, messages=messages, tools=tools
        )
    uses = [b for b in asked.content if b.type == "tool_use"]
    assert len(uses) == 2
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in asked.content]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": u.id, "content": "42"} for u in uses
            ],
        },
    ]
    raw = await client.messages.with_raw_response.create(
        model="scripted/tools", max_tokens=256, messages=messages, tools=tools
    )
    await client.close()
    session = await _one_session_of_two_steps(stack, since)
    assert raw.headers["x-tokenwire-session"] == session
    assert raw.headers["x-tokenwire-session-match"] == "tool-call-id"


async def test_the_openai_responses_tool_loop_is_one_session(stack: Stack) -> None:
    client = openai.AsyncOpenAI(base_url=stack.urls[0] + "/v1", api_key=GATEWAY_KEY)
    tools: list[Any] = [
        {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}
    ]
    since = len(stack.scripted.received)
    items: list[Any] = [{"role": "user", "content": "look it up"}]
    asked = await client.responses.create(model="scripted/tools", input=items, tools=tools)
    calls = [o for o in asked.output if o.type == "function_call"]
    assert len(calls) == 2
    items += [o.model_dump(exclude_none=True) for o in asked.output]
    items += [{"type": "function_call_output", "call_id": c.call_id, "output": "42"} for c in calls]
    raw = await client.responses.with_raw_response.create(
        model="scripted/tools", input=items, tools=tools
    )
    await client.close()
    await _one_session_of_two_steps(stack, since)
    assert raw.headers["x-tokenwire-session-match"] == "tool-call-id"
    assert raw.parse().output_text


async def test_langchain_chat_openai_tool_loop_is_one_session(stack: Stack) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr

    @tool
    def lookup() -> str:
        """Look the answer up."""
        return "42"

    chat = ChatOpenAI(
        model="scripted/tools", base_url=stack.urls[0] + "/v1", api_key=SecretStr(GATEWAY_KEY)
    )
    llm = chat.bind_tools([lookup])
    since = len(stack.scripted.received)
    messages: list[Any] = [HumanMessage("look it up")]
    asked = await llm.ainvoke(messages)
    assert len(asked.tool_calls) == 2  # LangChain parsed the arguments: it re-serialises them
    messages += [asked, *(ToolMessage("42", tool_call_id=c["id"]) for c in asked.tool_calls)]
    answer = await llm.ainvoke(messages)
    assert answer.content
    assert not answer.tool_calls
    await chat.root_async_client.close()
    await _one_session_of_two_steps(stack, since)


async def test_a_previous_response_id_joins_its_session_as_the_next_turn(
    nats_url, nc, topology
) -> None:
    """A forwarded Responses route (``openai-responses/...``, a real recorded OpenAI stream
    from a loopback upstream): the follow-up names only ``previous_response_id``."""
    recording = recordings_dir() / "openai-responses/responses-text.sse"
    with recorded_upstream({("openai-responses", "text"): recording}) as upstream:
        env = {"TOKENWIRE_OPENAI_RESPONSES_BASE_URL": upstream.url + "/v1"}
        async with threading_stack(nats_url, nc, topology, env=env) as stack:
            client = openai.AsyncOpenAI(base_url=stack.urls[0] + "/v1", api_key=GATEWAY_KEY)
            first: Any = await client.responses.with_raw_response.create(
                model="openai-responses/text", input="hello"
            )
            answered = first.parse()
            second: Any = await client.responses.with_raw_response.create(
                model="openai-responses/text",
                input="and then?",
                previous_response_id=answered.id,
            )
            await client.close()
            session = first.headers["x-tokenwire-session"]
            parents = await stack.parents(session)
    assert second.headers["x-tokenwire-session"] == session
    assert second.headers["x-tokenwire-session-match"] == "previous-response"
    assert (second.headers["x-tokenwire-turn"], second.headers["x-tokenwire-step"]) == ("1", "0")
    assert parents == {(0, 0): None, (1, 0): StepLink(session, 0, 0)}
