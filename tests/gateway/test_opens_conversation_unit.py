"""``opens_conversation``: a request with nothing the model said before (the hint that lets
the step registry guess a session is new, ``StepAllocator.begin_next_step(fresh=...)``)."""

from __future__ import annotations

from typing import Any

import pytest

from tokenwire.services.gateway._dialects import ANTHROPIC_MESSAGES, OPENAI_CHAT, OPENAI_RESPONSES

USER = {"role": "user", "content": "hi"}


@pytest.mark.parametrize(
    ("messages", "opens"),
    [
        ([USER], True),
        ([{"role": "system", "content": "be brief"}, USER], True),
        ([USER, {"role": "assistant", "content": "hello"}, USER], False),
        (
            [
                USER,
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "f", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "42"},
            ],
            False,
        ),
    ],
)
def test_openai_chat(messages: list[dict[str, Any]], opens: bool) -> None:
    req = OPENAI_CHAT.parse({"model": "m", "messages": messages})
    assert req.opens_conversation is opens


@pytest.mark.parametrize(
    ("messages", "opens"),
    [
        ([USER], True),
        ([USER, {"role": "assistant", "content": "hello"}, USER], False),
    ],
)
def test_anthropic_messages(messages: list[dict[str, Any]], opens: bool) -> None:
    req = ANTHROPIC_MESSAGES.parse({"model": "m", "max_tokens": 8, "messages": messages})
    assert req.opens_conversation is opens


@pytest.mark.parametrize(
    ("input_", "opens"),
    [
        ("hi", True),
        ([USER], True),
        ([{"type": "message", "role": "developer", "content": "be brief"}, USER], True),
        ([USER, {"type": "message", "role": "assistant", "content": "hello"}, USER], False),
        (
            [
                USER,
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "42"},
            ],
            False,
        ),
    ],
)
def test_openai_responses(input_: Any, opens: bool) -> None:
    req = OPENAI_RESPONSES.parse({"model": "m", "input": input_})
    assert req.opens_conversation is opens
