"""Threading's keys and headers, alone (``_access/threads.py``) and on the in-memory rig:
what a request is matched by, what a step's answer marks, what is told apart.

The expected keys are computed from the written-down conversations both ways (as a request
carries it, as a step asked and answered it): equal keys mean a match."""

from __future__ import annotations

import pytest

from tests.gateway._helpers import GATEWAY_KEY, make_rig, recording
from tokenwire.schemas import (
    Message,
    ReasoningBlock,
    StepLink,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from tokenwire.services.gateway._access.identity import StepIdentity
from tokenwire.services.gateway._access.threads import (
    Conversation,
    StepThread,
    history,
    lookup_key,
    read_parent,
    threading_off,
)
from tokenwire.services.gateway._dialects.neutral import NeutralMessage
from tokenwire.services.gateway._errors import InvalidRequestError

USER = NeutralMessage("user", [TextBlock("what is the weather?")])
CALL = ToolCallBlock(id="call_1", name="weather", arguments='{"city": "Paris", "unit": "C"}')
ANSWER = Message(
    content=[ReasoningBlock("thinking"), TextBlock("Let me "), TextBlock("check."), CALL],
    finish_reason="tool-calls",
)


def _thread(scope: str = "") -> StepThread:
    return StepThread(match="new", scope=scope, conversation=Conversation(lambda: [USER]))


def test_tool_results_match_the_id_of_the_call_they_answer() -> None:
    marks = _thread().marks(ANSWER, None)
    sent_back = [
        USER,
        NeutralMessage("assistant", [TextBlock("Let me check."), CALL]),
        NeutralMessage("tool", [ToolResultBlock("call_1", "18 C")]),
    ]
    key = lookup_key("", history(sent_back), None)
    assert key is not None
    assert key.kind == "tool-call-id"
    assert key.hash == marks[0]


def test_content_matches_as_the_sdks_send_the_answer_back() -> None:
    """Reasoning dropped, text joined, arguments re-serialised (LangChain's json.dumps)."""
    marks = _thread().marks(ANSWER, None)
    reserialised = ToolCallBlock(
        id="call_1", name="weather", arguments='{"unit":"C","city":"Paris"}'
    )
    sent_back = [
        USER,
        NeutralMessage("assistant", [TextBlock("Let me check."), reserialised]),
        NeutralMessage("user", [TextBlock("and tomorrow?")]),
    ]
    key = lookup_key("", history(sent_back), None)
    assert key is not None
    assert key.kind == "content"
    assert key.hash == marks[-1]


def test_another_answer_or_another_tenant_is_another_key() -> None:
    other_answer = Message(content=[TextBlock("Something else.")], finish_reason="stop")
    mine = set(_thread().marks(ANSWER, None))
    assert not mine & set(_thread().marks(other_answer, None))
    assert not mine & set(_thread("team-b").marks(ANSWER, None))


def test_a_conversations_first_call_has_no_key_and_previous_response_id_is_one() -> None:
    assert lookup_key("", history([USER]), None) is None
    key = lookup_key("", history([USER]), "resp_abc")
    assert key is not None
    assert key.kind == "previous-response"
    assert key.hash in _thread().marks(ANSWER, "resp_abc")


def test_the_parent_is_the_matched_step_else_the_previous_step_else_the_spawner() -> None:
    spawner = StepLink("lead", 0, 2)
    matched = StepThread(match="content", scope="", matched=StepLink("s", 0, 1))
    assert matched.parent(StepIdentity("s", 1, 0)) == StepLink("s", 0, 1)
    plain = StepThread(match="header", scope="", spawned_by=spawner)
    assert plain.parent(StepIdentity("s", 2, 3)) == StepLink("s", 2, 2)
    assert plain.parent(StepIdentity("s", 0, 0)) == spawner


@pytest.mark.parametrize("value", ["lead", "lead/0", "lead/x/1", "le ad/0/1", "lead/0/1/2"])
def test_a_malformed_parent_header_is_a_400(value: str) -> None:
    with pytest.raises(InvalidRequestError):
        read_parent({"x-tokenwire-parent": value})
    assert read_parent({"x-tokenwire-parent": "lead-1/3/4"}) == StepLink("lead-1", 3, 4)


def test_the_thread_header_is_on_or_off() -> None:
    assert threading_off({"x-tokenwire-thread": "OFF"})
    assert not threading_off({"x-tokenwire-thread": "on"})
    with pytest.raises(InvalidRequestError):
        threading_off({"x-tokenwire-thread": "maybe"})


async def test_the_rig_answers_a_bad_parent_with_a_400_before_any_provider_call() -> None:
    rig = make_rig(recording("openai/chat-text-include-usage.sse"))
    async with rig.client(Authorization=f"Bearer {GATEWAY_KEY}") as client:
        answer = await client.post(
            "/v1/chat/completions",
            json={"model": "openai/gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
            headers={"X-Tokenwire-Parent": "not a step"},
        )
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "x-tokenwire-parent"
    assert rig.upstream.requests == []
