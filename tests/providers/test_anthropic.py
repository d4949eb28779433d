"""AnthropicNormaliser against every real Anthropic recording, by hand and by the SDK's oracle.

Expected values are written here from reading the recordings (texts, ids, argument strings,
signature prefixes, usage numbers) and, independently, from the official ``anthropic`` SDK's
stream accumulator run over the same events. Events reach the normaliser through a tiny
splitter of this file (not ``tokenwire.sse``), so the two are tested apart; the socket tests
run the real parser over a real connection, the body cut at random byte positions (the seed
is printed).
"""

from __future__ import annotations

import json
import random
from typing import Any

import httpx2
import pytest
from anthropic.lib.streaming._beta_messages import accumulate_event

from tests.fixtures.recordings import recordings_dir
from tests.providers.conftest import (
    SEED,
    RecordingServer,
    Route,
    check_block_lifecycles,
    check_contract,
    ended,
    normalise_bytes,
    normalise_events,
    random_cuts,
    rebuild_blocks,
    recorded_events,
    recording_names,
    stream_over_socket,
    without_redacted,
)
from tokenwire.fold import fold
from tokenwire.providers._anthropic import AnthropicNormaliser
from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    Finish,
    Message,
    ReasoningBlock,
    RecordedError,
    StepError,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallBlock,
    ToolCallDelta,
    Usage,
)
from tokenwire.sse import SseEvent


def run(events: list[SseEvent]) -> list[StreamChunk]:
    return normalise_events(AnthropicNormaliser(), events)


def recording(name: str) -> list[SseEvent]:
    return recorded_events("anthropic", name)


# --- expected values, written by hand from each recording --------------------------------

CACHE_WRITE_TEXT = (
    "Here are concise summaries of the three articles:\n\n1. OpenLLMetry: New open-source "
    "library extends OpenTelemetry with LLM functionality, enabling deeper insights into AI "
    "model performance in applications. Key features include LLM-specific metrics/traces and "
    "integration with existing setups.\n\n2. Major LLM providers introduce prompt caching, "
    "dramatically improving speed and reducing costs for API calls. Benefits include "
    "millisecond response times, lower computational resources, and improved scalability. "
    "Particularly useful for applications with repetitive prompts like chatbots and content "
    "moderation.\n\n3. Unit testing is crucial in software development. Key benefits:\n- "
    "Catches bugs early\n- Saves time and money \n- Improves code quality\n- Facilitates "
    "refactoring\n- Serves as documentation\n- Enhances collaboration\nThe post emphasizes "
    "that unit testing is a professional responsibility with long-term payoffs."
)
CACHE_READ_TEXT = (
    "Here are concise summaries of the three articles:\n\n1. OpenLLMetry: New open-source "
    "library extending OpenTelemetry with LLM functionality. Key features include "
    "LLM-specific metrics/traces, integration with existing setups, and support for popular "
    "LLM frameworks. Aims to provide deeper insights into AI model performance in "
    "applications.\n\n2. Major LLM providers introduce prompt caching to improve speed and "
    "reduce costs. Benefits include faster response times, lower computational costs, and "
    "improved scalability. Particularly useful for applications with repetitive prompts like "
    "chatbots and content moderation. Expected to impact AI industry by enabling wider "
    "adoption and new application types.\n\n3. Importance of unit testing in software "
    "development:\n- Catches bugs early\n- Saves time and money\n- Improves code quality\n- "
    "Facilitates refactoring\n- Serves as documentation\n- Enhances collaboration\nThe post "
    "emphasizes that unit testing is crucial for professional software development and pays "
    "off in the long run."
)
PELICAN_THINKING = (
    "The user wants two names for a pet pelican, and wants me to be brief. I'll give two "
    "simple, fitting names.\n\nSome options:\n- Pete\n- Percy\n- Captain\n- Scoop\n- Bill\n- "
    "Gully\n\nI'll pick two good ones and keep it very short."
)
REDACTED_TEXT = (
    "I notice that you've sent what appears to be some kind of test string or command. I "
    'don\'t have any special "magic string" triggers or backdoor commands that would expose '
    "internal systems or change my behavior.\n\nI'm Claude, an AI assistant created by "
    "Anthropic to be helpful, harmless, and honest. How can I assist you today with a "
    "legitimate task or question?"
)
STATES_TEXT = (
    "Here are all 50 U.S. states in alphabetical order:\n\n1. Alabama\n2. Alaska\n3. Arizona\n"
    "4. Arkansas\n5. California\n6. Colorado\n7. Connecticut\n8. Delaware\n9"
)
COMPACTION_SUMMARY = (
    'The user provided a very long context consisting entirely of the repeated sentence "The '
    'quick brown fox jumps over the lazy dog." thousands of times, followed by the '
    'instruction "Now say hello."\n\nThe task is simply to respond to "Now say hello." - '
    "i.e., say hello.\n\nNext step: Say hello to the user."
)

# Per recording: index -> expected block (("text", str) | ("reasoning", text, sig_prefix) |
# ("redacted", data_prefix) | ("tool", id, name, arguments)), usage, finish, replay_state keys.
EXPECTED: dict[str, dict[str, Any]] = {
    "messages-text-short": {
        "blocks": {0: ("text", "Hello")},
        "usage": TokenUsage(10, 4, 0, 0, None),
        "finish": "stop",
    },
    "messages-thinking-then-text": {
        "blocks": {
            0: ("reasoning", PELICAN_THINKING, "EvoCCkYICxgCKkCY593D", "1P7LGAE="),
            1: ("text", "- Captain\n- Scoop"),
        },
        "usage": TokenUsage(46, 84, 0, 0, None),
        "finish": "stop",
    },
    "messages-thinking-then-tool-use-empty-input": {
        "blocks": {
            0: (
                "reasoning",
                "The user wants me to:\n1. Use the fixed_version tool\n2. Tell them the version\n"
                "3. Make a short joke about it\n\nLet me first call the fixed_version tool to "
                "see what version it returns.",
                "EoQDCm0IDhgCKkCDzGs2",
                "jSBwUxgB",
            ),
            # The only input_json_delta is "": a no-argument tool's arguments are "{}".
            1: ("tool", "toolu_01825dXWLSoJwCst1qTsiWdb", "fixed_version", "{}"),
        },
        # output_tokens 92 includes output_tokens_details.thinking_tokens 53.
        "usage": TokenUsage(598, 92 - 53, 0, 0, 53),
        "finish": "tool-calls",
    },
    "messages-two-tool-uses-input-json-delta": {
        "blocks": {
            0: (
                "text",
                "Certainly! I can help you with that information. To get the weather and "
                "current time in San Francisco, I'll need to use two separate functions. Let "
                "me fetch that data for you.",
            ),
            1: (
                "tool",
                "toolu_014x5X91kx3fvdhpLvwXZWE2",
                "get_weather",
                '{"location": "San Francisco, CA", "unit": "celsius"}',
            ),
            2: (
                "tool",
                "toolu_0121kXsENLvoDZ72LCuAnCCz",
                "get_time",
                '{"timezone": "America/Los_Angeles"}',
            ),
        },
        # message_delta sends output_tokens only; the rest survive from message_start.
        "usage": TokenUsage(506, 153, 0, 0, None),
        "finish": "tool-calls",
    },
    "messages-prompt-cache-write": {
        "blocks": {0: ("text", CACHE_WRITE_TEXT)},
        "usage": TokenUsage(4, 201, 0, 1165, None),
        "finish": "stop",
    },
    "messages-prompt-cache-read": {
        "blocks": {0: ("text", CACHE_READ_TEXT)},
        "usage": TokenUsage(4, 221, 1165, 0, None),
        "finish": "stop",
    },
    "messages-stop-max-tokens": {
        "blocks": {0: ("text", STATES_TEXT)},
        "usage": TokenUsage(15, 50, 0, 0, None),
        "finish": "max-tokens",
    },
    "messages-redacted-thinking": {
        "blocks": {
            0: ("redacted", "EqkECkYIBxgCKkA8AZ4noDfV5VcOJe/p3JTR", "Xjpot45vnBd4ewJ/hgB"),
            1: ("redacted", "EtgBCkYIBxgCKkDQfGkwzflEJP5asG3oQfJX", "J0GAE="),
            2: ("text", REDACTED_TEXT),
        },
        "usage": TokenUsage(92, 189, 0, 0, None),
        "finish": "stop",
    },
    "messages-server-tool-then-client-tool": {
        "blocks": {
            0: (
                "text",
                "Let me search for a tool that can provide current exchange rate information.",
            ),
            1: (
                "text",
                "I found the right tool! Let me fetch the current USD to EUR exchange rate "
                "for you.",
            ),
            2: (
                "tool",
                "toolu_01EFn5wTNBYA8Reni8rbmnHT",
                "get_exchange_rate",
                '{"from_currency": "USD", "to_currency": "EUR"}',
            ),
        },
        # message_delta's cumulative input_tokens (1591) replaces message_start's 702.
        "usage": TokenUsage(1591, 175, 0, 0, None),
        "finish": "tool-calls",
        "opaque": [
            {
                "position": 1,
                "block": {
                    "type": "server_tool_use",
                    "id": "srvtoolu_01S5swZdBmTzLDVzwcT5LbHp",
                    "name": "tool_search_tool_bm25",
                    "input": {"query": "USD EUR exchange rate currency conversion"},
                },
            },
            {
                "position": 2,
                "block": {
                    "type": "tool_search_tool_result",
                    "tool_use_id": "srvtoolu_01S5swZdBmTzLDVzwcT5LbHp",
                    "content": {
                        "type": "tool_search_tool_search_result",
                        "tool_references": [
                            {"type": "tool_reference", "tool_name": "get_exchange_rate"}
                        ],
                    },
                },
            },
        ],
    },
    "messages-compaction-cache-read": {
        "blocks": {0: ("text", "Hello! \N{WAVING HAND SIGN}")},
        # usage.iterations: compaction (in 100, out 83, cache read 55096) + message (181, 8).
        "usage": TokenUsage(100 + 181, 83 + 8, 55096, 0, None),
        "finish": "stop",
        "opaque": [{"position": 0, "block": {"type": "compaction", "content": COMPACTION_SUMMARY}}],
    },
}


def test_every_recording_has_expected_values() -> None:
    assert recording_names("anthropic") == sorted(EXPECTED)


def _check_block(got: Any, want: tuple[Any, ...]) -> None:
    match want:
        case ("text", text):
            assert got == TextBlock(text)
        case ("reasoning", text, sig_head, sig_tail):
            assert isinstance(got, ReasoningBlock)
            assert (got.text, got.redacted) == (text, None)
            assert got.signature is not None
            assert got.signature.startswith(sig_head)
            assert got.signature.endswith(sig_tail)
        case ("redacted", head, tail):
            assert isinstance(got, ReasoningBlock)
            assert (got.text, got.signature) == ("", None)
            assert got.redacted is not None
            assert got.redacted.startswith(head)
            assert got.redacted.endswith(tail)
        case ("tool", id_, name, arguments):
            assert got == ToolCallBlock(id_, name, arguments)
        case _:
            raise AssertionError(want)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recording_matches_hand_expected(name: str) -> None:
    check_expected(name, run(recording(name)))


def check_expected(name: str, chunks: list[StreamChunk]) -> None:
    want = EXPECTED[name]
    blocks = ended(chunks)
    assert sorted(blocks) == sorted(want["blocks"])
    for index, block in want["blocks"].items():
        _check_block(blocks[index], block)
    assert chunks[-2] == Usage(want["usage"])
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert (finish.reason, finish.error) == (want["finish"], None)
    opaque = want.get("opaque")
    assert finish.replay_state == ({"opaque_blocks": opaque} if opaque else None)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recording_obeys_adapter_contract(name: str) -> None:
    chunks = run(recording(name))
    assert [type(c) for c in chunks].count(Usage) == 1
    check_contract(chunks)
    check_block_lifecycles(chunks)
    # The deltas alone spell every block (what a delta-only consumer sees), bar opaque payloads.
    assert rebuild_blocks(chunks) == {i: without_redacted(b) for i, b in ended(chunks).items()}


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_recording_over_a_socket_split_at_random(
    recording_server: RecordingServer, name: str
) -> None:
    body = (recordings_dir() / "anthropic" / f"{name}.sse").read_bytes()
    cuts = random_cuts(len(body), random.Random(f"{SEED}:anthropic/{name}"))
    print(f"seed={SEED} cuts={cuts}")
    chunks = await stream_over_socket(recording_server, Route(body, cuts), AnthropicNormaliser())
    check_expected(name, chunks)
    assert chunks == run(recording(name))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recording_any_split_gives_the_same_chunks(name: str) -> None:
    body = (recordings_dir() / "anthropic" / f"{name}.sse").read_bytes()
    whole = run(recording(name))
    rnd = random.Random(f"{SEED}:anthropic/{name}:splits")
    print(f"seed={SEED}")
    for _ in range(15):
        cuts = random_cuts(len(body), rnd)
        assert normalise_bytes(body, AnthropicNormaliser(), cuts) == whole, cuts


# --- the SDK's accumulator as an independent oracle ---------------------------------------


def sdk_message(name: str) -> Any:
    snapshot = None
    bufs: dict[int, bytes] = {}
    for event in recording(name):
        if event.event == "ping":
            continue
        snapshot = accumulate_event(
            event=json.loads(event.data),
            current_snapshot=snapshot,
            json_bufs=bufs,
            request_headers=httpx2.Headers(),
        )
    return snapshot


SDK_STOP = {"end_turn": "stop", "tool_use": "tool-calls", "max_tokens": "max-tokens"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recording_matches_sdk_accumulator(name: str) -> None:
    sdk = sdk_message(name)
    chunks = run(recording(name))
    blocks = ended(chunks)
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    state = finish.replay_state or {}
    opaque = {o["position"]: o["block"] for o in state.get("opaque_blocks", [])}
    ours = iter(blocks[i] for i in sorted(blocks))
    # The SDK's content list holds every block at Anthropic's index; ours skip the opaque ones.
    for position, want in enumerate(sdk.content):
        if position in opaque:
            assert opaque[position] == want.model_dump(exclude_none=True)
        else:
            _compare_with_sdk(next(ours), want)
    assert next(ours, None) is None
    assert len(sdk.content) == len(blocks) + len(opaque)
    assert finish.reason == SDK_STOP[sdk.stop_reason]
    _compare_usage(chunks[-2], sdk.usage)


def _compare_with_sdk(ours: Any, want: Any) -> None:
    match want.type:
        case "text":
            assert ours == TextBlock(want.text)
        case "thinking":
            assert ours == ReasoningBlock(want.thinking, signature=want.signature)
        case "redacted_thinking":
            assert ours == ReasoningBlock("", redacted=want.data)
        case "tool_use":
            assert (ours.id, ours.name) == (want.id, want.name)
            assert json.loads(ours.arguments) == want.input
        case other:
            raise AssertionError(f"{other} should have been an opaque block")


def _compare_usage(usage: Any, sdk: Any) -> None:
    assert isinstance(usage, Usage)
    got = usage.usage
    rows = sdk.iterations or [sdk]  # with compaction the billed usage is the iterations' sum
    assert got.input_tokens == sum(r.input_tokens for r in rows)
    assert got.cache_read_tokens == sum(r.cache_read_input_tokens for r in rows)
    assert got.cache_write_tokens == sum(r.cache_creation_input_tokens for r in rows)
    details = sdk.output_tokens_details
    thinking = details.thinking_tokens if details is not None else None
    assert got.reasoning_tokens == thinking
    assert got.output_tokens == sum(r.output_tokens for r in rows) - (thinking or 0)


# --- the fold over the normalised chunks -----------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recording_folds_to_expected_message(name: str) -> None:
    want = EXPECTED[name]
    message = fold(run(recording(name)))
    assert isinstance(message, Message)
    assert message.finish_reason == want["finish"]
    assert message.usage == want["usage"]
    texts = [b[1] for _, b in sorted(want["blocks"].items()) if b[0] == "text"]
    assert message.text == "".join(texts)
    tools = [ToolCallBlock(*b[1:]) for _, b in sorted(want["blocks"].items()) if b[0] == "tool"]
    if want["finish"] == "max-tokens":
        assert (message.tool_calls, message.dropped_tool_calls) == ([], tools)
    else:
        assert (message.tool_calls, message.dropped_tool_calls) == (tools, [])
    reasoning = [b for b in message.content if isinstance(b, ReasoningBlock)]
    assert len(reasoning) == sum(b[0] in ("reasoning", "redacted") for b in want["blocks"].values())


# --- error paths and decisions, on hand-made events ---------------------------------------


def ev(kind: str, payload: dict[str, Any]) -> SseEvent:
    return SseEvent(data=json.dumps({"type": kind, **payload}), event=kind)


START = ev(
    "message_start", {"message": {"id": "m", "usage": {"input_tokens": 7, "output_tokens": 1}}}
)


def text_block(index: int, text: str) -> list[SseEvent]:
    return [
        ev("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}}),
        ev("content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": text}}),
        ev("content_block_stop", {"index": index}),
    ]


def stop(reason: str, output_tokens: int = 5) -> list[SseEvent]:
    return [
        ev(
            "message_delta",
            {"delta": {"stop_reason": reason}, "usage": {"output_tokens": output_tokens}},
        ),
        ev("message_stop", {}),
    ]


def test_overloaded_error_event_ends_step_retryable_after_what_was_emitted() -> None:
    error = ev("error", {"error": {"type": "overloaded_error", "message": "Overloaded"}})
    normaliser = AnthropicNormaliser()
    chunks = [c for e in [START, *text_block(0, "Hi"), error] for c in normaliser.feed(e)]
    assert chunks == [
        BlockStart(0, "text"),
        TextDelta(0, "Hi"),
        BlockEnd(0, TextBlock("Hi")),
        Usage(TokenUsage(input_tokens=7, output_tokens=1)),
        Finish("error", StepError("Overloaded", retryable=True, code="overloaded_error")),
    ]
    # Nothing after finish: later events and close() add nothing.
    assert [c for e in stop("end_turn") for c in normaliser.feed(e)] == []
    assert normaliser.close() == []


def test_invalid_request_error_is_not_retryable() -> None:
    error = ev("error", {"error": {"type": "invalid_request_error", "message": "bad"}})
    assert run([error])[-1] == Finish(
        "error", StepError("bad", retryable=False, code="invalid_request_error")
    )


def test_undecodable_json_ends_step_with_error() -> None:
    broken = SseEvent(
        data='{"type":"content_block_delta","index":0,"delta":', event="content_block_delta"
    )
    chunks = run([START, *text_block(0, "Hi")[:2], broken, *text_block(1, "late")])
    assert chunks[:2] == [BlockStart(0, "text"), TextDelta(0, "Hi")]
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert finish.reason == "error"
    assert finish.error is not None
    assert finish.error.message.startswith("undecodable Anthropic event")
    assert chunks[-2] == Usage(TokenUsage(input_tokens=7, output_tokens=1))
    assert len(chunks) == 4  # nothing of the later block


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_body_ending_before_message_stop_finishes_with_error(name: str) -> None:
    events = [e for e in recording(name) if e.event != "message_stop"]
    chunks = run(events)
    assert [type(c) for c in chunks].count(Finish) == 1
    finish = chunks[-1]
    assert finish == Finish(
        "error",
        StepError(
            "stream ended before the provider finished (no message_stop)",
            retryable=True,
            code="stream_truncated",
        ),
    )
    assert isinstance(chunks[-2], Usage)  # the usage seen so far, before the finish
    result = fold(chunks)
    assert isinstance(result, RecordedError)
    assert result.kind == "provider"


def test_tool_use_without_any_input_fragment_has_empty_object_arguments() -> None:
    # The empty-input recording's tool block, minus its only ("") input_json_delta.
    events = [
        e
        for e in recording("messages-thinking-then-tool-use-empty-input")
        if '"partial_json":""' not in e.data
    ]
    chunks = run(events)
    tool_chunks = [c for c in chunks if getattr(c, "index", None) == 1]
    assert tool_chunks == [
        BlockStart(1, "tool-call"),
        ToolCallDelta(1, "toolu_01825dXWLSoJwCst1qTsiWdb", "fixed_version", ""),
        ToolCallDelta(1, "toolu_01825dXWLSoJwCst1qTsiWdb", None, "{}"),
        BlockEnd(1, ToolCallBlock("toolu_01825dXWLSoJwCst1qTsiWdb", "fixed_version", "{}")),
    ]


@pytest.mark.parametrize(
    ("reason", "finish", "state"),
    [
        ("end_turn", "stop", None),
        ("stop_sequence", "stop", None),
        ("tool_use", "tool-calls", None),
        ("max_tokens", "max-tokens", None),
        ("refusal", "refusal", None),
        ("pause_turn", "stop", {"stop_reason": "pause_turn"}),
        ("model_context_window_exceeded", "max-tokens", None),
        ("some_future_reason", "stop", {"stop_reason": "some_future_reason"}),
    ],
)
def test_stop_reason_mapping(reason: str, finish: str, state: Any) -> None:
    chunks = run([START, *text_block(0, "x"), *stop(reason)])
    assert chunks[-1] == Finish(finish, replay_state=state)  # type: ignore[arg-type]  # the recording's finish reason, a Literal at run time
    assert chunks[-2] == Usage(TokenUsage(input_tokens=7, output_tokens=5))


def test_ping_and_unknown_events_are_ignored() -> None:
    noise = [
        SseEvent(data='{"type": "ping"}', event="ping"),
        SseEvent(data='{"type": "brand_new_event", "x": 1}', event="brand_new_event"),
    ]
    plain = run([START, *text_block(0, "x"), *stop("end_turn")])
    noisy = run([START, noise[0], *text_block(0, "x"), noise[1], *stop("end_turn")])
    assert noisy == plain


@pytest.mark.parametrize(
    "events",
    [
        [
            START,
            ev("content_block_delta", {"index": 3, "delta": {"type": "text_delta", "text": "x"}}),
        ],
        [START, *text_block(0, "x")[:2], *stop("end_turn")],  # message_stop with block 0 open
        [START, *text_block(0, "x")[:1], *text_block(0, "x")[:1]],  # started twice
        [START, *text_block(0, "x"), ev("message_stop", {})],  # no stop_reason
    ],
    ids=["delta-for-unopened", "stop-with-open-block", "started-twice", "no-stop-reason"],
)
def test_protocol_violations_finish_with_protocol_error(events: list[SseEvent]) -> None:
    chunks = run(events)
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert finish.error is not None
    assert (finish.reason, finish.error.code) == ("error", "protocol_error")
    assert [type(c) for c in chunks].count(Finish) == 1


def test_unnamed_events_are_decoded_by_their_type() -> None:
    named = [START, *text_block(0, "x"), *stop("end_turn")]
    ping = SseEvent(data='{"type": "ping"}')
    unnamed = [SseEvent(data=e.data) for e in named]
    assert run([unnamed[0], ping, *unnamed[1:]]) == run(named)
