"""Bad input gets a 4xx in the endpoint's dialect and publishes nothing; failures are recorded.

The expected error shapes are the dialects' documented error objects.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from tests.gateway._helpers import (
    ANTHROPIC_KEY,
    GATEWAY_KEY,
    OPENAI_KEY,
    make_rig,
    recording,
)
from tokenwire.broker import BrokerUnavailable, MemoryPublisher
from tokenwire.providers import ProviderHTTPError
from tokenwire.schemas import Finish
from tokenwire.services.gateway import FramePolicy

AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
OPENAI_OK: dict[str, Any] = {
    "model": "openai/gpt-4o",
    "messages": [{"role": "user", "content": "hi"}],
}
ANTHROPIC_OK: dict[str, Any] = {
    "model": "anthropic/claude-sonnet-4-5",
    "max_tokens": 10,
    "messages": [{"role": "user", "content": "hi"}],
}
ENDPOINTS = {
    "openai": ("/v1/chat/completions", OPENAI_OK),
    "anthropic": ("/v1/messages", ANTHROPIC_OK),
}


def assert_dialect_error(dialect: str, response, status: int) -> Any:
    assert response.status_code == status, response.text
    body = response.json()
    if dialect == "openai":
        assert set(body) == {"error"}
        assert set(body["error"]) == {"message", "type", "param", "code"}
        assert isinstance(body["error"]["message"], str)
        assert body["error"]["message"]
        return body["error"]
    assert body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}
    assert isinstance(body["error"]["message"], str)
    assert body["error"]["message"]
    return body["error"]


def _bad_cases(ok: dict[str, Any], stop: str) -> list[tuple[str, bytes, dict[str, str], int]]:
    """(name, body, extra headers, expected status) of every bad-input case; ``stop`` names
    the dialect's stop-sequences field."""
    enc = lambda d: json.dumps(d).encode()  # noqa: E731
    return [
        ("malformed json", b'{"model": "openai/gpt-4o", "messages": [', {}, 400),
        ("not an object", b"[1, 2, 3]", {}, 400),
        ("empty body", b"", {}, 400),
        ("model not a string", enc({**ok, "model": 42}), {}, 400),
        ("messages not a list", enc({**ok, "messages": "hi"}), {}, 400),
        ("messages empty", enc({**ok, "messages": []}), {}, 400),
        ("bad role", enc({**ok, "messages": [{"role": "wizard", "content": "x"}]}), {}, 400),
        ("stream not a bool", enc({**ok, "stream": "yes"}), {}, 400),
        ("max_tokens negative", enc({**ok, "max_tokens": -5}), {}, 400),
        ("no provider", enc({**ok, "model": "gpt-4o"}), {}, 404),
        ("unknown provider", enc({**ok, "model": "nope/gpt-4o"}), {}, 404),
        ("empty model name", enc({**ok, "model": "openai/"}), {}, 404),
        ("bad session", enc(ok), {"x-tokenwire-session": "a b"}, 400),
        ("long session", enc(ok), {"x-tokenwire-session": "a" * 129}, 400),
        (
            "bad turn",
            enc(ok),
            {"x-tokenwire-session": "s", "x-tokenwire-turn": "-1", "x-tokenwire-step": "0"},
            400,
        ),
        (
            "turn not int",
            enc(ok),
            {"x-tokenwire-session": "s", "x-tokenwire-turn": "x", "x-tokenwire-step": "0"},
            400,
        ),
        ("turn without step", enc(ok), {"x-tokenwire-session": "s", "x-tokenwire-turn": "1"}, 400),
        (
            "untranslatable parameter",  # the Responses API has no stop sequences
            enc({**ok, "model": "openai-responses/gpt-4o", stop: ["END"]}),
            {},
            400,
        ),
        ("oversized body", enc({**ok, "pad": "x" * 5000}), {}, 413),
    ]


STOP_FIELD = {"openai": "stop", "anthropic": "stop_sequences"}
CASES = [(d, *case) for d, (_, ok) in ENDPOINTS.items() for case in _bad_cases(ok, STOP_FIELD[d])]


@pytest.mark.parametrize(
    ("dialect", "name", "body", "headers", "status"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES]
)
async def test_bad_input_is_a_dialect_4xx_and_publishes_nothing(
    dialect, name, body, headers, status
):
    rig = make_rig(recording("openai/chat-text-include-usage.sse"), max_body_bytes=4096)
    path, _ = ENDPOINTS[dialect]
    async with rig.client(**AUTH, **headers) as client:
        response = await client.post(
            path, content=body, headers={"content-type": "application/json"}
        )
    error = assert_dialect_error(dialect, response, status)
    if dialect == "anthropic" and status == 413:
        assert error["type"] == "request_too_large"
    assert rig.sink.messages == []
    assert rig.steps.claimed == set()
    assert rig.upstream.requests == []


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
@pytest.mark.parametrize(
    "auth",
    [{}, {"authorization": "Bearer wrong"}, {"x-api-key": "wrong"}, {"authorization": GATEWAY_KEY}],
    ids=["none", "wrong-bearer", "wrong-x-api-key", "no-bearer-prefix"],
)
async def test_missing_or_wrong_key_is_401(dialect, auth):
    rig = make_rig(recording("openai/chat-text-include-usage.sse"))
    path, ok = ENDPOINTS[dialect]
    async with rig.client(**auth) as client:
        response = await client.post(path, json=ok)
    error = assert_dialect_error(dialect, response, 401)
    assert error["type"] == "authentication_error"
    assert rig.sink.messages == []
    assert rig.upstream.requests == []


async def test_x_api_key_is_accepted_and_no_keys_means_open():
    rig = make_rig(recording("openai/chat-text-include-usage.sse"))
    async with rig.client(**{"x-api-key": GATEWAY_KEY}) as client:
        assert (await client.post("/v1/chat/completions", json=OPENAI_OK)).status_code == 200
    open_rig = make_rig(recording("openai/chat-text-include-usage.sse"), keys=frozenset())
    async with open_rig.client() as client:
        assert (await client.post("/v1/chat/completions", json=OPENAI_OK)).status_code == 200


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
async def test_an_explicit_triple_used_by_another_request_is_409(dialect):
    rig = make_rig(recording("openai/chat-text-include-usage.sse"))
    path, ok = ENDPOINTS[dialect]
    ids = {"x-tokenwire-session": "sess-1", "x-tokenwire-turn": "3", "x-tokenwire-step": "1"}
    ok = {**ok, "model": "openai/gpt-4o"}
    async with rig.client(**AUTH, **ids) as client:
        first = await client.post(path, json=ok)
        published = len(rig.sink.messages)
        second = await client.post(path, json={**ok, "temperature": 0.5})
    assert first.status_code == 200
    assert [first.headers[k] for k in ids] == list(ids.values())
    error = assert_dialect_error(dialect, second, 409)
    assert "by a different request" in str(error)
    assert second.headers["x-should-retry"] == "false"
    assert len(rig.sink.messages) == published
    assert len(rig.upstream.requests) == 1


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
async def test_the_same_request_for_a_used_triple_gets_the_same_answer_again(dialect):
    """docs/gateway.md, "Resuming a step": no provider call, nothing published, the folded
    answer named as the first one (the provider's id and model)."""
    rig = make_rig(recording("openai/chat-text-include-usage.sse"))
    path, ok = ENDPOINTS[dialect]
    ids = {"x-tokenwire-session": "sess-2", "x-tokenwire-turn": "0", "x-tokenwire-step": "0"}
    ok = {**ok, "model": "openai/gpt-4o"}
    async with rig.client(**AUTH, **ids) as client:
        first = await client.post(path, json=ok)
        published = len(rig.sink.messages)
        again = await client.post(path, json=dict(reversed(ok.items())))  # key order: the same
    assert (first.status_code, again.status_code) == (200, 200), again.text
    assert again.json() == first.json()
    assert again.headers["x-tokenwire-resumed"] == "true"
    assert len(rig.sink.messages) == published
    assert len(rig.upstream.requests) == 1


async def test_turns_and_steps_are_assigned_from_the_last_message():
    rig = make_rig(recording("openai/chat-text-include-usage.sse"))
    tool = [*OPENAI_OK["messages"], {"role": "tool", "tool_call_id": "c", "content": "r"}]
    seen = []
    async with rig.client(**AUTH, **{"x-tokenwire-session": "s1"}) as client:
        for messages in (OPENAI_OK["messages"], tool, tool, OPENAI_OK["messages"]):
            r = await client.post("/v1/chat/completions", json={**OPENAI_OK, "messages": messages})
            seen.append((r.headers["x-tokenwire-turn"], r.headers["x-tokenwire-step"]))
    assert seen == [("0", "0"), ("0", "1"), ("0", "2"), ("1", "0")]


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [True, False])
async def test_provider_http_error_is_relayed_and_recorded(dialect, stream):
    leak = f"Incorrect API key provided: {OPENAI_KEY} / {ANTHROPIC_KEY}"
    rig = make_rig(ProviderHTTPError(429, leak, retryable=True, code="rate_limit_exceeded"))
    path, ok = ENDPOINTS[dialect]
    async with rig.client(**AUTH) as client:
        response = await client.post(path, json={**ok, "stream": stream})
    error = assert_dialect_error(dialect, response, 429)
    assert OPENAI_KEY not in response.text
    assert ANTHROPIC_KEY not in response.text
    assert "rate" in error["type"]
    [published] = rig.sink.messages
    assert published.first
    assert published.envelope.ordinal == 0
    finish = published.envelope.chunk
    assert isinstance(finish, Finish)
    assert finish.reason == "error"
    assert finish.error is not None
    assert finish.error.retryable
    assert OPENAI_KEY not in published.raw.decode()
    assert ANTHROPIC_KEY not in published.raw.decode()
    assert response.headers["x-tokenwire-session"] == published.envelope.session


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
async def test_provider_5xx_is_502(dialect):
    rig = make_rig(ProviderHTTPError(500, "boom", retryable=True))
    path, ok = ENDPOINTS[dialect]
    async with rig.client(**AUTH) as client:
        response = await client.post(path, json=ok)
    assert_dialect_error(dialect, response, 502)
    assert len(rig.sink.messages) == 1


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [True, False])
async def test_broker_down_before_the_first_chunk_is_503(dialect, stream):
    rig = make_rig(
        recording("openai/chat-text-include-usage.sse"), sink=MemoryPublisher(fail_after=0)
    )
    path, ok = ENDPOINTS[dialect]
    async with rig.client(**AUTH) as client:
        response = await client.post(path, json={**ok, "model": "openai/gpt-4o", "stream": stream})
    error = assert_dialect_error(dialect, response, 503)
    assert "broker" in error["message"]


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
async def test_broker_failure_mid_stream_ends_the_stream_with_an_error(dialect):
    rig = make_rig(  # each provider read's chunks in a message of their own
        recording("openai/chat-text-include-usage.sse"),
        sink=MemoryPublisher(fail_after=3),
        framing=FramePolicy(linger_ms=0),
    )
    path, ok = ENDPOINTS[dialect]
    async with rig.client(**AUTH) as client:
        response = await client.post(path, json={**ok, "model": "openai/gpt-4o", "stream": True})
    assert response.status_code == 200
    last = response.text.strip().split("\n\n")[-1]
    if dialect == "openai":
        assert json.loads(last.removeprefix("data: "))["error"]["message"].startswith("the broker")
        assert "[DONE]" not in response.text
    else:
        assert last.startswith("event: error")
        assert "message_stop" not in response.text
    assert len(rig.sink.frames) == 3


@pytest.mark.parametrize("stream", [True, False])
async def test_unacknowledged_step_is_never_answered_as_complete(stream):
    rig = make_rig(
        recording("openai/chat-text-include-usage.sse"), sink=MemoryPublisher(fail_acks=True)
    )
    async with rig.client(**AUTH) as client:
        response = await client.post("/v1/chat/completions", json={**OPENAI_OK, "stream": stream})
    if stream:
        assert response.status_code == 200
        assert "[DONE]" not in response.text
        assert '"error"' in response.text.strip().split("\n\n")[-1]
    else:
        assert_dialect_error("openai", response, 503)


async def test_stream_cut_by_the_provider_ends_with_error_and_finish_error_is_published():
    body = recording("openai/chat-text-include-usage.sse")
    cut = body[: len(body) // 2].rsplit(b"\n\n", 1)[0] + b"\n\n"
    rig = make_rig(cut)
    async with rig.client(**AUTH) as client:
        response = await client.post("/v1/chat/completions", json={**OPENAI_OK, "stream": True})
    assert response.status_code == 200
    assert '"error"' in response.text.strip().split("\n\n")[-1]
    assert "[DONE]" not in response.text
    finish = rig.envelopes()[-1].chunk
    assert isinstance(finish, Finish)
    assert finish.reason == "error"


async def test_no_route_ever_answers_500():
    rig = make_rig(recording("openai/chat-text-include-usage.sse"))
    async with rig.client(**AUTH) as client:
        statuses = [
            (await client.get("/v1/chat/completions")).status_code,
            (await client.post("/nowhere")).status_code,
            (await client.post("/v1/messages", content=b"\xff\xfe")).status_code,
            (await client.post("/v1/messages", json={"model": None})).status_code,
            (
                await client.post(
                    "/v1/chat/completions", json={"model": "openai/x", "messages": [{}]}
                )
            ).status_code,
        ]
    assert all(400 <= s < 500 for s in statuses), statuses


# OpenAI's 401 echoes the key it refused, masked: the legacy form keeps the first five
# characters after ``sk-`` and the last four, a project key's form its prefix and last four.
MASKED_ECHOES = [
    f"Incorrect API key provided: {OPENAI_KEY[:8]}{'*' * 39}{OPENAI_KEY[-4:]}. You can find "
    "your API key at https://platform.openai.com/account/api-keys.",
    f"Incorrect API key provided: sk-proj-{'*' * 140}{OPENAI_KEY[-4:]}.",
]


@pytest.mark.parametrize("echo", MASKED_ECHOES)
@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
async def test_a_provider_401_echoing_the_masked_key_answers_and_logs_no_part_of_it(
    dialect: str, echo: str, caplog: pytest.LogCaptureFixture
) -> None:
    rig = make_rig(ProviderHTTPError(401, echo, retryable=False, code="invalid_api_key"))
    path, ok = ENDPOINTS[dialect]
    with caplog.at_level(logging.DEBUG):
        async with rig.client(**AUTH) as client:
            response = await client.post(path, json=ok)
    assert_dialect_error(dialect, response, 502)
    assert "Incorrect API key provided" in response.text  # the provider's words stay
    [published] = rig.sink.messages
    for seen in (response.text, caplog.text, published.raw.decode()):
        assert OPENAI_KEY[-4:] not in seen
        assert OPENAI_KEY[:8] not in seen


BROKER_AT = "nats://broker-SENTINEL.internal:4222"


class FarPublisher(MemoryPublisher):
    """A publisher whose broker went away: its error names the broker's internal address,
    as the real one's does (``BrokerUnavailable``)."""

    async def publish(self, *args: Any, **kwargs: Any) -> Any:
        if self.fail_after is not None and len(self.frames) >= self.fail_after:
            raise BrokerUnavailable(BROKER_AT, "connection closed")
        return await super().publish(*args, **kwargs)


@pytest.mark.parametrize(("fail_after", "stream"), [(0, False), (0, True), (3, True)])
@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
async def test_a_broker_away_is_told_to_the_caller_without_its_address(
    dialect: str, fail_after: int, stream: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Before the first chunk (the 503) and mid-stream (the error event): the caller learns
    the broker is away, not where it lives; the log has the address."""
    rig = make_rig(
        recording("openai/chat-text-include-usage.sse"),
        sink=FarPublisher(fail_after=fail_after),
        framing=FramePolicy(linger_ms=0),
    )
    path, ok = ENDPOINTS[dialect]
    with caplog.at_level(logging.DEBUG):
        async with rig.client(**AUTH) as client:
            body = {**ok, "model": "openai/gpt-4o", "stream": stream}
            response = await client.post(path, json=body)
    assert response.status_code == (200 if fail_after else 503)
    assert "the broker" in response.text
    assert "SENTINEL" not in response.text
    assert BROKER_AT in caplog.text
