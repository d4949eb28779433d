"""OpenAIResponsesNormaliser on every Responses API recording, plus the error paths.

Expected values: literals written here from the recordings, and the recording's own final
items (``response.output_item.done`` carries each item whole), read with ``json`` in the
test: an oracle independent of how the adapter assembles deltas.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.providers.conftest import (
    SEED,
    RecordingServer,
    Route,
    check_contract,
    ended_blocks,
    normalise_bytes,
    normalise_events,
    only,
    random_cuts,
    rebuild_blocks,
    stream_over_socket,
    without_redacted,
)
from tokenwire.fold import fold
from tokenwire.providers import OpenAIResponsesNormaliser
from tokenwire.schemas import (
    ContentBlock,
    Finish,
    Message,
    ReasoningBlock,
    RecordedError,
    StepError,
    StreamChunk,
    TextBlock,
    TokenUsage,
    ToolCallBlock,
    Usage,
)
from tokenwire.sse import SseEvent


def U(inp: int, out: int, cached: int, reasoning: int) -> TokenUsage:
    return TokenUsage(
        input_tokens=inp, output_tokens=out, cache_read_tokens=cached, reasoning_tokens=reasoning
    )


@dataclass(frozen=True)
class Case:
    path: str
    finish: str
    usage: TokenUsage | None
    response_id: str
    facts: list[ContentBlock | str]  # a block, or a "kind:start" prefix check
    error: StepError | None = None


QUOTA = (
    "You exceeded your current quota, please check your plan and billing details. For more "
    "information on this error, read the docs: "
    "https://platform.openai.com/docs/guides/error-codes/api-errors."
)
CASES = [
    Case(
        "responses-text.sse",
        "stop",
        U(16, 11, 0, 0),
        "resp_0360bd45725b0a010068f966a4c4a881959717ba17b93477ef",
        [TextBlock("4200 + 42 equals 4242.")],
    ),
    Case(
        "responses-reasoning-then-function-call.sse",
        "tool-calls",
        U(53, 469 - 448, 0, 448),
        "resp_0050471a34b36ae60068c97b94a480819587a9d70cf2979b33",
        [
            "reasoning:",
            ToolCallBlock("call_CWXgs68YprAjp6t0371hiPOI", "final_result", '{"result":6666}'),
        ],
    ),
    Case(
        "responses-parallel-function-calls.sse",
        "tool-calls",
        U(36, 54, 0, 0),
        "resp_0c3b09d20eedf2d30068f966b9b7048190b7501a24a1447ec0",
        [
            ToolCallBlock(
                "call_sKC7OABqf2A2PTLCm0CLeRWV", "secret_retrieval_tool", '{"password":"mellon"}'
            ),
            ToolCallBlock(
                "call_OdR3s3xop0vtgkDyWRMLafuH", "secret_retrieval_tool", '{"password":"radiance"}'
            ),
        ],
    ),
    Case(
        "responses-incomplete-max-output-tokens.sse",
        "max-tokens",
        U(14, 50, 0, 0),
        "resp_0cca8afa69cc6ca90068f966c4826c8193ae5b3f5ad5030e49",
        ["text:Sure! Here is a list of all 50 U.S. states:\n\n1. Alabama"],
    ),
    Case(
        "responses-reasoning-summary.sse",
        "stop",
        U(32, 839 - 832, 0, 832),
        "resp_0a1097cbfef27a8c00696afa23fb9c819693455c72eabd7718",
        [
            "reasoning:**Exploring prime numbers**\n\nI need to find prime numbers less than 400",
            TextBlock("3"),
        ],
    ),
    # 8320 of the 9463 input tokens were cache reads; 512 of the 582 output tokens reasoning.
    Case(
        "responses-web-search-cached-tokens.sse",
        "stop",
        U(9463 - 8320, 582 - 512, 8320, 512),
        "resp_00a60507bf41223d0068c9d2fbf93481a0ba2a7796ae2cab4c",
        [
            "reasoning:",
            "reasoning:",
            "text:San Francisco weather today (Tuesday, September 16, 2025): Mostly sunny",
        ],
    ),
    Case(
        "responses-error-insufficient-quota.sse",
        "error",
        None,
        "",
        [],
        StepError(QUOTA, retryable=False, code="insufficient_quota"),
    ),
]
IDS = [c.path for c in CASES]


def body_of(recordings: Path, case: Case) -> bytes:
    return (recordings / "openai-responses" / case.path).read_bytes()


def final_items(body: bytes) -> list[ContentBlock]:
    """The blocks the recording's own ``output_item.done`` events describe, in order."""
    blocks: list[ContentBlock] = []
    for frame in body.decode().split("\n\n"):
        data = [line[6:] for line in frame.split("\n") if line.startswith("data: ")]
        event = json.loads(data[0]) if data else {}
        if event.get("type") != "response.output_item.done":
            continue
        item = event["item"]
        if item["type"] == "reasoning":
            summary = "\n\n".join(part["text"] for part in item.get("summary", []))
            blocks.append(ReasoningBlock(summary, redacted=item.get("encrypted_content")))
        elif item["type"] == "function_call":
            blocks.append(ToolCallBlock(item["call_id"], item["name"], item["arguments"]))
        elif item["type"] == "message":
            blocks += [TextBlock(part["text"]) for part in item["content"]]
    return blocks


def check_expected(case: Case, body: bytes, chunks: list[StreamChunk]) -> None:
    check_contract(chunks)
    assert [u.usage for u in only(chunks, Usage)] == ([case.usage] if case.usage else [])
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert finish.reason == case.finish
    assert finish.error == case.error
    blocks = ended_blocks(chunks)
    if case.error is None:
        assert finish.replay_state is not None
        assert finish.replay_state["response_id"] == case.response_id
        assert blocks == final_items(body)
        rebuilt = rebuild_blocks(chunks)
        assert [without_redacted(b) for b in blocks] == [rebuilt[i] for i in sorted(rebuilt)]
    assert len(blocks) == len(case.facts)
    for block, fact in zip(blocks, case.facts, strict=True):
        if isinstance(fact, str):
            kind, _, start = fact.partition(":")
            assert isinstance(block, ReasoningBlock if kind == "reasoning" else TextBlock)
            assert block.text.startswith(start)
        else:
            assert block == fact


def check_folded(case: Case, chunks: list[StreamChunk]) -> None:
    result = fold(chunks)
    if case.error is not None:
        assert result == RecordedError(
            kind="provider", message=QUOTA, retryable=False, code="insufficient_quota"
        )
        return
    assert isinstance(result, Message)
    assert result.finish_reason == case.finish
    assert result.usage == case.usage
    assert result.content == ended_blocks(chunks)
    assert result.replay_state is not None
    assert result.replay_state["response_id"] == case.response_id


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_recording_over_a_socket_split_at_random(
    recordings: Path, recording_server: RecordingServer, case: Case
) -> None:
    body = body_of(recordings, case)
    rnd = random.Random(f"{SEED}:{case.path}")
    cuts = random_cuts(len(body), rnd)
    print(f"seed={SEED} cuts={cuts}")
    norm = OpenAIResponsesNormaliser()
    chunks = await stream_over_socket(recording_server, Route(body, cuts), norm)
    check_expected(case, body, chunks)
    check_folded(case, chunks)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_recording_any_split_gives_the_same_chunks(recordings: Path, case: Case) -> None:
    body = body_of(recordings, case)
    whole = normalise_bytes(body, OpenAIResponsesNormaliser(), [])
    check_expected(case, body, whole)
    rnd = random.Random(f"{SEED}:{case.path}:splits")
    print(f"seed={SEED}")
    for _ in range(10):
        cuts = random_cuts(len(body), rnd)
        assert normalise_bytes(body, OpenAIResponsesNormaliser(), cuts) == whole


def test_every_responses_recording_is_covered(recordings: Path) -> None:
    on_disk = sorted(p.name for p in (recordings / "openai-responses").glob("*.sse"))
    assert on_disk == sorted(IDS)


# --- synthetic streams ---


def ev(kind: str, **fields: object) -> SseEvent:
    return SseEvent(event=kind, data=json.dumps({"type": kind, **fields}))


def run(*events: SseEvent) -> list[StreamChunk]:
    return normalise_events(OpenAIResponsesNormaliser(), events)


def test_body_ending_before_response_completed_is_an_error() -> None:
    out = run(
        ev("response.output_item.added", output_index=0, item={"type": "message"}),
        ev("response.output_text.delta", output_index=0, content_index=0, delta="Hi"),
    )
    check_contract(out)
    assert out[-1] == Finish(
        reason="error",
        error=StepError("stream ended before the provider finished", retryable=True),
    )


def test_refusal_part_is_text_and_finishes_refusal() -> None:
    out = run(
        ev(
            "response.content_part.added", output_index=0, content_index=0, part={"type": "refusal"}
        ),
        ev("response.refusal.delta", output_index=0, content_index=0, delta="No."),
        ev("response.content_part.done", output_index=0, content_index=0),
        ev("response.completed", response={"id": "r1"}),
    )
    check_contract(out)
    assert ended_blocks(out) == [TextBlock("No.")]
    assert out[-1] == Finish(reason="refusal", replay_state={"response_id": "r1"})


def test_arguments_sent_only_whole_are_passed_on() -> None:
    item = {"type": "function_call", "call_id": "c", "name": "f", "arguments": ""}
    done = item | {"arguments": '{"x": 1}'}
    out = run(
        ev("response.output_item.added", output_index=0, item=item),
        ev("response.output_item.done", output_index=0, item=done),
        ev("response.completed", response={"id": "r"}),
    )
    assert ended_blocks(out) == [ToolCallBlock("c", "f", '{"x": 1}')]
    assert rebuild_blocks(out)[0] == ToolCallBlock("c", "f", '{"x": 1}')


def test_failed_without_error_event_and_retryable_code() -> None:
    failed = {"id": "r", "error": {"code": "server_error", "message": "boom"}}
    out = run(ev("response.failed", response=failed))
    assert out == [Finish(reason="error", error=StepError("boom", True, "server_error"))]


def test_undecodable_event_we_read_ends_the_step_unknown_one_is_ignored() -> None:
    norm = OpenAIResponsesNormaliser()
    assert norm.feed(SseEvent(data='{"type": "response.audio.delta", "delta": 5}')) == []
    out = norm.feed(SseEvent(data='{"type": "response.output_text.delta", "delta": 5}'))
    assert isinstance(out[-1], Finish)
    assert out[-1].reason == "error"
    assert norm.close() == []


def test_incomplete_for_content_filter() -> None:
    out = run(
        ev("response.incomplete", response={"incomplete_details": {"reason": "content_filter"}})
    )
    assert out == [Finish(reason="content-filter")]
