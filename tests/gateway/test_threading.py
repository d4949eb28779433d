"""Threading over real sockets and a real nats-server: an unmodified agent (the official
openai SDK, no tokenwire header) keeps its tool loop in one session, two agents that open
alike stay apart, steps name their parents (a DAG for parallel tool calls answered
separately, a link across sessions for a sub-agent), and an unnamed request costs at most one
broker read, counted on the broker (``$JS.API.>``).

Ground truth: the session each request reached as the scripted provider saw it (the gateway
sends it ``X-Tokenwire-Session``), and the steps' first chunks as the broker holds them.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.gateway._helpers import GATEWAY_KEY
from tests.gateway._threading_rig import Stack, threading_stack
from tokenwire.schemas import StepLink

TOOLS: Any = [
    {
        "type": "function",
        "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
    }
]


@pytest.fixture
async def stack(nats_url, nc, topology):
    async with threading_stack(nats_url, nc, topology, gateways=2) as rig:
        yield rig


def _client(url: str, **headers: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=url + "/v1", api_key=GATEWAY_KEY, max_retries=0, default_headers=headers
    )


async def _ask(
    client: openai.AsyncOpenAI, messages: list[Any], *, stream: bool = False
) -> tuple[dict[str, Any], dict[str, str]]:
    """One chat call: the assistant message as the SDK assembled it (a dict to send back) and
    the answer's headers."""
    raw: Any = await client.chat.completions.with_raw_response.create(
        model="scripted/tools", messages=messages, tools=TOOLS, stream=stream
    )
    headers = dict(raw.headers)
    if not stream:
        folded: dict[str, Any] = raw.parse().choices[0].message.model_dump(exclude_none=True)
        return folded, headers
    text, calls = "", dict[int, dict[str, str]]()
    async for chunk in raw.parse():
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += call.id or ""
                slot["name"] += (call.function.name or "") if call.function else ""
                slot["arguments"] += (call.function.arguments or "") if call.function else ""
    message: dict[str, Any] = {"role": "assistant", "content": text or None}
    if calls:
        message["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for _, c in sorted(calls.items())
        ]
    return message, headers


def _identity(headers: dict[str, str]) -> tuple[str, int, int, str]:
    return (
        headers["x-tokenwire-session"],
        int(headers["x-tokenwire-turn"]),
        int(headers["x-tokenwire-step"]),
        headers["x-tokenwire-session-match"],
    )


def _results(message: dict[str, Any], only: int | None = None) -> list[dict[str, Any]]:
    calls = message["tool_calls"]
    chosen = calls if only is None else [calls[only]]
    return [{"role": "tool", "tool_call_id": c["id"], "content": "42"} for c in chosen]


def _scripted_sessions(stack: Stack, since: int) -> list[str]:
    """The session of each request the scripted provider received since ``since``."""
    return [r.headers["x-tokenwire-session"] for r in list(stack.scripted.received)[since:]]


@pytest.mark.parametrize("stream", [False, True], ids=["folded", "streamed"])
async def test_an_unmodified_openai_tool_loop_is_one_session_of_two_steps(
    stack: Stack, stream: bool
) -> None:
    client = _client(stack.urls[0])
    seen = len(stack.scripted.received)
    opening = [{"role": "user", "content": "what is the answer?"}]
    asked, first = await _ask(client, opening, stream=stream)
    assert len(asked["tool_calls"]) == 2
    follow = [*opening, asked, *_results(asked)]
    answer, second = await _ask(client, follow, stream=stream)
    await client.close()
    session = first["x-tokenwire-session"]
    assert _identity(first) == (session, 0, 0, "new")
    assert _identity(second) == (session, 0, 1, "tool-call-id")
    assert second["x-tokenwire-parent"] == f"{session}/0/0"
    assert answer.get("tool_calls") is None
    assert answer["content"]
    assert _scripted_sessions(stack, seen) == [session, session]
    assert await stack.parents(session) == {(0, 0): None, (0, 1): StepLink(session, 0, 0)}


async def test_two_agents_that_open_alike_stay_apart_and_each_follow_up_joins_its_own(
    stack: Stack,
) -> None:
    client = _client(stack.urls[0])
    opening = [{"role": "user", "content": "the same opening message"}]
    asked_a, head_a = await _ask(client, opening)
    asked_b, head_b = await _ask(client, opening)
    session_a, session_b = head_a["x-tokenwire-session"], head_b["x-tokenwire-session"]
    assert session_a != session_b
    assert head_a["x-tokenwire-session-match"] == head_b["x-tokenwire-session-match"] == "new"
    _, follow_b = await _ask(client, [*opening, asked_b, *_results(asked_b)])
    _, follow_a = await _ask(client, [*opening, asked_a, *_results(asked_a)])
    assert _identity(follow_a)[:3] == (session_a, 0, 1)
    assert _identity(follow_b)[:3] == (session_b, 0, 1)
    await client.close()


async def test_a_new_user_message_after_an_answer_is_the_next_turn_matched_by_content(
    stack: Stack,
) -> None:
    client = _client(stack.urls[0])
    conversation: list[Any] = [{"role": "user", "content": "first question"}]
    asked, head = await _ask(client, conversation)
    conversation += [asked, *_results(asked)]
    answer, _ = await _ask(client, conversation)
    conversation += [answer, {"role": "user", "content": "and a second one"}]
    _, third = await _ask(client, conversation)
    await client.close()
    session = head["x-tokenwire-session"]
    assert _identity(third) == (session, 1, 0, "content")
    assert third["x-tokenwire-parent"] == f"{session}/0/1"
    parents = await stack.parents(session)
    assert parents[(1, 0)] == StepLink(session, 0, 1)


async def test_parallel_tool_calls_answered_in_separate_calls_make_a_dag(stack: Stack) -> None:
    client = _client(stack.urls[0])
    opening = [{"role": "user", "content": "two tools at once"}]
    asked, head = await _ask(client, opening)
    _, one = await _ask(client, [*opening, asked, *_results(asked, only=0)])
    _, two = await _ask(client, [*opening, asked, *_results(asked, only=1)])
    await client.close()
    session = head["x-tokenwire-session"]
    assert {_identity(one)[:3], _identity(two)[:3]} == {(session, 0, 1), (session, 0, 2)}
    parents = await stack.parents(session)
    root = StepLink(session, 0, 0)
    assert parents == {(0, 0): None, (0, 1): root, (0, 2): root}


async def test_a_sub_agent_session_names_the_step_that_spawned_it(stack: Stack) -> None:
    lead = _client(stack.urls[0])
    _asked, head = await _ask(lead, [{"role": "user", "content": "delegate this"}])
    spawner = f"{head['x-tokenwire-session']}/0/0"
    worker = _client(stack.urls[1], **{"X-Tokenwire-Parent": spawner})  # on every request
    opening = [{"role": "user", "content": "the delegated task"}]
    sub_asked, sub_head = await _ask(worker, opening)
    _, sub_follow = await _ask(worker, [*opening, sub_asked, *_results(sub_asked)])
    await lead.close()
    await worker.close()
    sub = sub_head["x-tokenwire-session"]
    assert sub != head["x-tokenwire-session"]
    assert sub_head["x-tokenwire-parent"] == spawner
    assert _identity(sub_follow) == (sub, 0, 1, "tool-call-id")
    parent_session, turn, step = spawner.split("/")
    assert await stack.parents(sub) == {
        (0, 0): StepLink(parent_session, int(turn), int(step)),
        (0, 1): StepLink(sub, 0, 0),  # inside the sub-agent's session, its own graph
    }


async def test_an_unnamed_request_costs_at_most_one_broker_read(stack: Stack) -> None:
    """Counted on the broker: every JetStream API read request while one request ran. The
    follow-up goes to the other gateway instance, which never saw the session (its step
    pointer comes with the thread mark)."""
    first_gw, second_gw = _client(stack.urls[0]), _client(stack.urls[1])
    opening = [{"role": "user", "content": "count the reads"}]
    await stack.settle()
    stack.tap.reset()
    asked, head = await _ask(first_gw, opening)
    await stack.settle()
    opening_reads = stack.tap.reads()
    stack.tap.reset()
    _, follow = await _ask(second_gw, [*opening, asked, *_results(asked)])
    await stack.settle()
    follow_reads = stack.tap.reads()
    await first_gw.close()
    await second_gw.close()
    assert _identity(follow)[:3] == (head["x-tokenwire-session"], 0, 1)
    assert opening_reads == []  # a conversation's first call: nothing to match, nothing read
    assert len(follow_reads) == 1, follow_reads
    assert f"KV_{stack.topology.registry_buckets[0]}" in follow_reads[0]  # the thread mark


async def test_the_thread_header_opts_out(stack: Stack) -> None:
    client = _client(stack.urls[0], **{"X-Tokenwire-Thread": "off"})
    opening = [{"role": "user", "content": "no threading please"}]
    asked, head = await _ask(client, opening)
    _, follow = await _ask(client, [*opening, asked, *_results(asked)])
    await client.close()
    assert _identity(follow)[3] == "new"
    assert follow["x-tokenwire-session"] != head["x-tokenwire-session"]


async def test_a_named_sessions_steps_write_no_thread_keys(stack: Stack) -> None:
    """A caller that names its session continues it by name: its steps mark nothing, so the
    same conversation sent again without the header finds nothing to join."""
    named = _client(stack.urls[0], **{"X-Tokenwire-Session": "named-no-marks"})
    opening = [{"role": "user", "content": "a named session"}]
    asked, head = await _ask(named, opening)
    await named.close()
    unnamed = _client(stack.urls[0])
    _, follow = await _ask(unnamed, [*opening, asked, *_results(asked)])
    await unnamed.close()
    assert _identity(head) == ("named-no-marks", 0, 0, "header")
    assert _identity(follow)[3] == "new"
    assert follow["x-tokenwire-session"] != "named-no-marks"
