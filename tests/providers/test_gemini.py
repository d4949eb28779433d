"""GeminiNormaliser against every real Gemini recording, with values written from the recordings.

Events reach the normaliser through the test's own naive splitter (CRLF folded by hand), so
this tests the normaliser apart from ``tokenwire.sse``; the socket tests run the real parser
over a real connection, the CRLF-framed body cut at random byte positions (seed printed).
There is no Gemini SDK accumulator to use as an oracle: the arithmetic is checked against
``totalTokenCount`` in the comments below.
"""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import pytest

from tests.fixtures.recordings import recordings_dir
from tests.providers.conftest import (
    SEED,
    RecordingServer,
    Route,
    check_block_lifecycles,
    check_contract,
    ended_or_cut,
    normalise_bytes,
    normalise_events,
    random_cuts,
    rebuild_blocks,
    recorded_events,
    recording_names,
    stream_over_socket,
)
from tokenwire.fold import fold
from tokenwire.providers._gemini import GeminiNormaliser, signed_call_id, split_call_id
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
    return normalise_events(GeminiNormaliser(), events)


def recording(name: str) -> list[SseEvent]:
    return recorded_events("google", name)


# --- expected values, written from each recording -----------------------------------------

CROSSING_THOUGHTS = (
    "**Clarifying User Goals**\n\nI'm currently focused on defining the user's "
    "ultimate goal: ensuring their safety while crossing the street. I've pinpointed "
    "that this is a real-world scenario with significant safety considerations. "
    "However, I'm also mindful of my limitations as an AI and my inability "
    "to physically assist or visually assess the situation.\n\n\n**Developing "
    "a Safety Protocol**\n\nI'm now formulating a comprehensive safety procedure. "
    "I've pinpointed the essential first step: finding a safe crossing location, "
    "such as marked crosswalks or intersections. Stopping at the curb, and "
    "looking and listening for traffic are vital too. The rationale behind "
    '"look left, right, then left again" now needs further exploration. I\'m '
    "focusing on crafting universally applicable and secure steps.\n\n\n**Prioritizing "
    "Safe Crossing**\n\nI've revised the procedure's initial step, emphasizing "
    "safe crossing zones (crosswalks, intersections). Next, I'm integrating "
    'the "look left, right, then left" sequence, considering why it\'s repeated. '
    "I'm focusing on crafting universal, safety-focused instructions that suit "
    "diverse situations and address my inherent limitations.\n\n\n**Crafting Safe "
    "Instructions**\n\nI've identified the core user intent: to learn safe street-crossing. "
    "Now, I'm focusing on crafting universally applicable steps. Finding safe "
    "crossing locations and looking-listening for traffic remain paramount. "
    "I'm prioritizing direct, clear language, addressing my limitations as "
    "an AI. I'm crafting advice that works generally, regardless of specific "
    "circumstances or locations.\n\n\n"
)
CROSSING_ANSWER = (
    "This is a great question! Safely crossing the street is all about being "
    "aware and predictable. Here is a step-by-step guide that is widely taught "
    "for safety:\n\n### 1. Find a Safe Place to Cross\nThe best place is always "
    "at a designated **crosswalk** or a **street corner/intersection**. These "
    "are places where drivers expect to see pedestrians. Avoid crossing in "
    "the middle of the block or from between parked cars.\n\n### 2. Stop at the "
    "Edge of the Curb\nStand on the sidewalk, a safe distance from the edge "
    "of the street. This gives you a clear view of the traffic without putting "
    'you in danger.\n\n### 3. Look and Listen for Traffic\nFollow the "Left-Right-Left" '
    "rule:\n*   **Look left** for the traffic that will be closest to you first.\n* "
    "  **Look right** for oncoming traffic in the other lane.\n*   **Look left "
    "again** to make sure nothing has changed.\n*   **Listen** for the sound "
    "of approaching vehicles that you might not be able to see.\n\n### 4. Wait "
    "for a Safe Gap\nWait until there is a large enough gap in traffic for you "
    "to walk all the way across. Don't assume a driver will stop for you. If "
    "you can, try to **make eye contact** with drivers to ensure they have "
    "seen you.\n\n### 5. Walk, Don't Run\nOnce it's safe:\n*   Walk straight across "
    "the street.\n*   **Keep looking and listening** for traffic as you cross. "
    "The situation can change quickly.\n*   **Don't use your phone** or wear "
    "headphones that block out the sound of traffic.\n\n---\n\n### Special Situations:\n\n* "
    '  **At a Traffic Light:** Wait for the pedestrian signal to show the "Walk" '
    "sign (often a symbol of a person walking). Even when the sign says to "
    "walk, you should still look left and right before crossing.\n*   **At a "
    "Stop Sign:** Wait for the car to come to a complete stop. Make eye contact "
    "with the driver before you step into the street to be sure they see you.\n\nThe "
    "most important rule is to **stay alert and be predictable**. Always assume "
    "a driver might not see you."
)

# Per recording: index -> block, usage (promptTokenCount - cached, candidatesTokenCount,
# cached, None, thoughtsTokenCount; the last usageMetadata wins), finish, and the thought
# signatures as (block index, prefix, suffix, length).
EXPECTED: dict[str, dict[str, Any]] = {
    "gemini-stream-text": {
        "blocks": {0: TextBlock("The capital of France is Paris.\n")},
        # Events 1-2 say promptTokenCount 15 and no candidates; the last says 13 and 8.
        "usage": TokenUsage(13, 8, None, None, None),
        "finish": "stop",
        "signatures": [],
    },
    "gemini-stream-thinking": {
        "blocks": {0: ReasoningBlock(CROSSING_THOUGHTS), 1: TextBlock(CROSSING_ANSWER)},
        # 34 + 469 + 787 = totalTokenCount 1290: candidates exclude thoughts.
        "usage": TokenUsage(34, 469, None, None, 787),
        "finish": "stop",
        "signatures": [(1, "CiIB0e2Kb6Syj1a961EfbWv4", "gMKlqm/dH8k=", 6152)],
    },
    "gemini-stream-function-call-thought-signature": {
        "blocks": {0: ToolCallBlock("call_0_get_country", "get_country", "{}")},
        # 29 + 10 + 202 = totalTokenCount 241.
        "usage": TokenUsage(29, 10, None, None, 202),
        "finish": "tool-calls",
        "signatures": [(0, "EpwICpkIAXLI2nxlU6gsWZaZ", "AXOk15QuFyU=", 1408)],
    },
    "gemini-stream-max-tokens": {
        "blocks": {0: TextBlock("Here are all 50 U.S.")},
        # 9 + 10 + 38 = totalTokenCount 57.
        "usage": TokenUsage(9, 10, None, None, 38),
        "finish": "max-tokens",
        "signatures": [],
    },
}


def test_every_recording_has_expected_values() -> None:
    assert recording_names("google") == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recording_matches_hand_expected(name: str) -> None:
    check_expected(name, run(recording(name)))


def expected_blocks(name: str) -> dict[int, Any]:
    """EXPECTED's blocks, each tool call's id carrying the thought signature of its
    ``functionCall`` part, read from the recording with ``json`` and re-encoded base64url
    without padding by the standard library (the id scheme in docs/providers.md)."""
    signatures: dict[str, str] = {}
    for line in (recordings_dir() / "google" / f"{name}.sse").read_text().splitlines():
        if not line.startswith("data: "):
            continue
        for candidate in json.loads(line[6:]).get("candidates", []):
            for part in candidate.get("content", {}).get("parts", []):
                if "functionCall" in part and "thoughtSignature" in part:
                    signatures[part["functionCall"]["name"]] = part["thoughtSignature"]
    out: dict[int, Any] = {}
    for index, block in EXPECTED[name]["blocks"].items():
        out[index] = block
        if isinstance(block, ToolCallBlock) and block.name in signatures:
            raw = base64.b64decode(signatures[block.name])
            suffix = base64.urlsafe_b64encode(raw).decode().rstrip("=")
            signed = f"{block.id}__thought__{suffix}"
            out[index] = ToolCallBlock(signed, block.name, block.arguments)
    return out


def check_expected(name: str, chunks: list[StreamChunk]) -> None:
    want = EXPECTED[name]
    assert ended_or_cut(chunks) == expected_blocks(name)
    assert chunks[-2] == Usage(want["usage"])
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert (finish.reason, finish.error) == (want["finish"], None)
    signatures = (finish.replay_state or {}).get("thought_signatures", [])
    assert [(s["index"], len(s["signature"])) for s in signatures] == [
        (index, length) for index, _, _, length in want["signatures"]
    ]
    for got, (_, head, tail, _) in zip(signatures, want["signatures"], strict=True):
        assert got["signature"].startswith(head)
        assert got["signature"].endswith(tail)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recording_obeys_adapter_contract(name: str) -> None:
    chunks = run(recording(name))
    assert [type(c) for c in chunks].count(Usage) == 1
    assert [type(c) for c in chunks].count(Finish) == 1
    assert isinstance(chunks[-2], Usage)
    assert isinstance(chunks[-1], Finish)
    check_contract(chunks)
    check_block_lifecycles(chunks)
    assert rebuild_blocks(chunks) == ended_or_cut(chunks)  # the deltas alone spell every block


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_recording_over_a_socket_split_at_random(
    recording_server: RecordingServer, name: str
) -> None:
    body = (recordings_dir() / "google" / f"{name}.sse").read_bytes()
    cuts = random_cuts(len(body), random.Random(f"{SEED}:google/{name}"))
    print(f"seed={SEED} cuts={cuts}")
    chunks = await stream_over_socket(recording_server, Route(body, cuts), GeminiNormaliser())
    check_expected(name, chunks)
    assert chunks == run(recording(name))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recording_any_split_gives_the_same_chunks(name: str) -> None:
    body = (recordings_dir() / "google" / f"{name}.sse").read_bytes()
    whole = run(recording(name))
    rnd = random.Random(f"{SEED}:google/{name}:splits")
    print(f"seed={SEED}")
    for _ in range(15):
        cuts = random_cuts(len(body), rnd)
        assert normalise_bytes(body, GeminiNormaliser(), cuts) == whole, cuts


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recording_folds_to_expected_message(name: str) -> None:
    want = EXPECTED[name]
    blocks = expected_blocks(name)
    message = fold(run(recording(name)))
    assert isinstance(message, Message)
    assert message.content == [blocks[i] for i in sorted(blocks)]
    assert (message.finish_reason, message.usage) == (want["finish"], want["usage"])
    calls = [b for b in blocks.values() if isinstance(b, ToolCallBlock)]
    assert message.tool_calls == calls
    assert message.dropped_tool_calls == []


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_body_ending_before_finish_reason_finishes_with_error(name: str) -> None:
    events = [e for e in recording(name) if '"finishReason"' not in e.data]
    chunks = run(events)
    assert chunks[-1] == Finish(
        "error",
        StepError(
            "stream ended before the provider finished (no finishReason)",
            retryable=True,
            code="stream_truncated",
        ),
    )
    assert [type(c) for c in chunks].count(Finish) == 1
    assert isinstance(fold(chunks), RecordedError)


# --- decisions and error paths, on hand-made events ---------------------------------------


def chunk_event(parts: list[dict[str, Any]], finish: str | None = None, **extra: Any) -> SseEvent:
    candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
    if finish is not None:
        candidate["finishReason"] = finish
    return SseEvent(data=json.dumps({"candidates": [candidate], **extra}))


USAGE = {"promptTokenCount": 1000, "cachedContentTokenCount": 600, "candidatesTokenCount": 20}


def test_cached_tokens_are_subtracted_from_the_prompt_and_tool_prompts_added() -> None:
    meta = {**USAGE, "toolUsePromptTokenCount": 30, "thoughtsTokenCount": 7}
    chunks = run([chunk_event([{"text": "ok"}], "STOP", usageMetadata=meta)])
    assert chunks[-2] == Usage(TokenUsage(1000 - 600 + 30, 20, 600, None, 7))


def test_usage_only_event_after_finish_reason_still_counts() -> None:
    last = SseEvent(data=json.dumps({"usageMetadata": USAGE}))
    chunks = run([chunk_event([{"text": "ok"}], "STOP"), last])
    assert chunks == [
        BlockStart(0, "text"),
        TextDelta(0, "ok"),
        BlockEnd(0, TextBlock("ok")),
        Usage(TokenUsage(400, 20, 600)),
        Finish("stop"),
    ]


@pytest.mark.parametrize(
    ("reason", "finish", "retryable"),
    [
        ("STOP", "stop", None),
        ("MAX_TOKENS", "max-tokens", None),
        ("SAFETY", "content-filter", None),
        ("RECITATION", "content-filter", None),
        ("PROHIBITED_CONTENT", "content-filter", None),
        ("BLOCKLIST", "content-filter", None),
        ("SPII", "content-filter", None),
        ("MALFORMED_FUNCTION_CALL", "error", True),
        ("OTHER", "error", False),
        ("FINISH_REASON_UNSPECIFIED", "error", False),
        ("SOMETHING_NEW", "error", False),
    ],
)
def test_finish_reason_mapping(reason: str, finish: str, retryable: bool | None) -> None:
    last = run([chunk_event([{"text": "x"}], reason)])[-1]
    assert isinstance(last, Finish)
    assert last.reason == finish
    if retryable is None:
        assert last.error is None
    else:
        assert last.error == StepError(f"Gemini finishReason {reason}", retryable, reason)


def test_function_calls_keep_provider_ids_and_args_bytes_and_end_open_text() -> None:
    parts: list[dict[str, Any]] = [
        {"text": "Let me check."},
        {"functionCall": {"id": "fc-1", "name": "a", "args": {"x": [1, 2]}}},
        {"functionCall": {"name": "b", "args": {}}},
    ]
    chunks = run([chunk_event(parts, "STOP")])
    assert chunks[:-1] == [
        BlockStart(0, "text"),
        TextDelta(0, "Let me check."),
        BlockEnd(0, TextBlock("Let me check.")),
        BlockStart(1, "tool-call"),
        ToolCallDelta(1, "fc-1", "a", '{"x": [1, 2]}'),
        BlockEnd(1, ToolCallBlock("fc-1", "a", '{"x": [1, 2]}')),
        BlockStart(2, "tool-call"),
        ToolCallDelta(2, "call_2_b", "b", "{}"),
        BlockEnd(2, ToolCallBlock("call_2_b", "b", "{}")),
    ]
    assert chunks[-1] == Finish("tool-calls")


def test_signature_on_an_empty_trailing_text_part_has_no_block() -> None:
    events = [
        chunk_event([{"text": "hi"}]),
        chunk_event([{"text": "", "thoughtSignature": "S"}], "STOP"),
    ]
    finish = run(events)[-1]
    assert finish == Finish(
        "stop", replay_state={"thought_signatures": [{"index": 0, "signature": "S"}]}
    )
    alone = run([chunk_event([{"text": "", "thoughtSignature": "S"}], "STOP")])[-1]
    assert alone == Finish(
        "stop", replay_state={"thought_signatures": [{"index": None, "signature": "S"}]}
    )


def test_blocked_prompt_finishes_with_content_filter() -> None:
    blocked = SseEvent(
        data=json.dumps(
            {"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 5}}
        )
    )
    assert run([blocked]) == [Usage(TokenUsage(input_tokens=5)), Finish("content-filter")]


def test_error_event_ends_step_after_what_was_emitted() -> None:
    error = SseEvent(
        data=json.dumps(
            {"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}
        )
    )
    normaliser = GeminiNormaliser()
    chunks = [
        c
        for e in [chunk_event([{"text": "par"}], usageMetadata=USAGE), error]
        for c in normaliser.feed(e)
    ]
    assert chunks == [
        BlockStart(0, "text"),
        TextDelta(0, "par"),
        Usage(TokenUsage(400, 20, 600)),
        Finish("error", StepError("The model is overloaded.", retryable=True, code="UNAVAILABLE")),
    ]
    assert normaliser.feed(chunk_event([{"text": "more"}], "STOP")) == []
    assert normaliser.close() == []


def test_undecodable_json_ends_step_with_error() -> None:
    chunks = run([chunk_event([{"text": "a"}]), SseEvent(data='{"candidates": [')])
    assert chunks[:2] == [BlockStart(0, "text"), TextDelta(0, "a")]
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert finish.error is not None
    assert (finish.reason, finish.error.retryable) == ("error", False)
    assert finish.error.message.startswith("undecodable Gemini event")
    assert len(chunks) == 3


def test_no_usage_metadata_means_no_usage_chunk() -> None:
    assert run([chunk_event([{"text": "a"}], "STOP")]) == [
        BlockStart(0, "text"),
        TextDelta(0, "a"),
        BlockEnd(0, TextBlock("a")),
        Finish("stop"),
    ]


def test_a_signed_call_id_gives_back_the_signature_exactly() -> None:
    signature = base64.b64encode(bytes(range(256))).decode()  # has +, / and = padding
    signed = signed_call_id("call_0_f", signature)
    assert signed.startswith("call_0_f__thought__")
    assert set(signed) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
    assert split_call_id(signed) == ("call_0_f", signature)
    assert split_call_id("call_0_f") == ("call_0_f", None)
    assert signed_call_id("call_0_f", None) == "call_0_f"
    assert signed_call_id("call_0_f", "not base64!") == "call_0_f"


def test_a_function_call_with_a_signature_gets_a_signed_id() -> None:
    signature = base64.b64encode(b"opaque signature bytes").decode()
    parts = [{"functionCall": {"name": "f", "args": {}}, "thoughtSignature": signature}]
    chunks = run([chunk_event(parts, "STOP")])
    (call,) = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert split_call_id(call.id) == ("call_0_f", signature)
