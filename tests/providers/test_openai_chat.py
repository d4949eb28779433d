"""OpenAIChatNormaliser on every Chat Completions recording, plus the error paths.

Expected values are written here by hand from the recordings (texts, ids, names, argument
strings, usage numbers, finish reasons) and cross-checked with the official openai SDK's
``ChatCompletionStreamState`` accumulator, an independent oracle. Never from our own output.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from openai._models import construct_type
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from tests.providers.conftest import (
    SEED,
    RecordingServer,
    Route,
    check_contract,
    ended_blocks,
    ended_or_cut,
    normalise_bytes,
    normalise_events,
    only,
    random_cuts,
    rebuild_blocks,
    stream_over_socket,
)
from tokenwire.fold import fold
from tokenwire.providers import OpenAIChatNormaliser
from tokenwire.schemas import (
    ContentBlock,
    Finish,
    FinishReason,
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


@dataclass(frozen=True)
class Case:
    path: str
    finish: str
    usage: TokenUsage | None
    blocks: list[ContentBlock] | None = None  # None: long texts, checked by starts/ends
    starts: list[str] = field(default_factory=list)  # per block, when blocks is None
    ends: list[str] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    error: StepError | None = None


def U(inp: int, out: int, cached: int | None, reasoning: int | None) -> TokenUsage:
    return TokenUsage(
        input_tokens=inp, output_tokens=out, cache_read_tokens=cached, reasoning_tokens=reasoning
    )


CASES = [
    Case(
        "openai/chat-text-include-usage.sse",
        "stop",
        U(14, 8, 0, 0),
        [TextBlock("The capital of Mexico is Mexico City.")],
    ),
    Case(
        "openai/chat-single-tool-call-fragmented-args.sse",
        "tool-calls",
        U(423, 15, 0, 0),
        [ToolCallBlock("call_Vz0Sie91Ap56nH0ThKGrZXT7", "get_weather", '{"city":"Mexico City"}')],
    ),
    Case(
        "openai/chat-parallel-tool-calls-fragmented-usage.sse",
        "tool-calls",
        U(75, 53, 0, 0),
        [
            ToolCallBlock(
                "call_M26z19sncd7b4LBgzKRRbaUE", "secret_retrieval_tool", '{"password": "mellon"}'
            ),
            ToolCallBlock(
                "call_KPXe5NX7IcKkaBUhc6dto2QV", "secret_retrieval_tool", '{"password": "radiance"}'
            ),
        ],
    ),
    Case(
        "openai/chat-parallel-tool-calls-no-usage.sse",
        "tool-calls",
        None,
        [
            ToolCallBlock(
                "call_cCPjAyfwTzboEKjVlqFrArNF",
                "get_current_weather",
                '{"location": "San Francisco"}',
            ),
            ToolCallBlock(
                "call_Zi4He1Ns0mozwT6f85nW1BOW", "get_current_weather", '{"location": "Boston"}'
            ),
        ],
    ),
    Case(
        "openai/chat-parallel-tool-calls-empty-args.sse",
        "tool-calls",
        U(364, 40, 0, 0),
        [
            ToolCallBlock("call_3rqTYrA6H21AYUaRGP4F66oq", "get_country", "{}"),
            ToolCallBlock("call_Xw9XMKBJU48kAAd78WgIswDx", "get_product_name", "{}"),
        ],
    ),
    Case(
        "openai/chat-finish-length-usage.sse",
        "max-tokens",
        U(14, 50, 0, 0),
        None,
        ["Here is a list of all 50 U.S. states:\n\n1. Alabama\n"],
        ["9. Florida\n10"],
        ["text"],
    ),
    # Reasoning model cut off while thinking: every completion token was reasoning.
    Case("openai/chat-finish-length-reasoning-only.sse", "max-tokens", U(13, 0, 0, 50), []),
    Case(
        "openai/chat-refusal-structured-output.sse",
        "refusal",
        U(64, 13, 0, 0),
        [TextBlock("I'm very sorry, but I can't assist with that request.")],
    ),
    Case(
        "openai/legacy-completions-finish-length.sse",
        "max-tokens",
        None,
        [
            TextBlock(
                ".\n\nGetting naked\n\nHow does opentelemetry know when someone is "
                "streaming your IP"
            )
        ],
    ),
    Case(
        "azure-openai/chat-text-content-filter.sse",
        "stop",
        None,
        [
            TextBlock(
                "Why did the Opentelemetry developer bring a ladder to the coding "
                "competition? \n\nBecause they wanted to reach new traces!"
            )
        ],
    ),
    # DeepSeek: prompt_cache_hit_tokens taken out of prompt_tokens; reasoning out of completion.
    Case(
        "deepseek/reasoner-reasoning-content-usage.sse",
        "stop",
        U(6, 212 - 198, 0, 198),
        None,
        ['Hmm, the user just said "Hello".', "Hello there! \U0001f60a How can I help you today?"],
        ["", "today?"],
        ["reasoning", "text"],
    ),
    Case(
        "deepseek/chat-text-usage.sse",
        "stop",
        U(12, 89, 0, None),
        None,
        ["Sure! Here's a techy joke for you:"],
        [" \U0001f604"],
        ["text"],
    ),
    Case(
        "deepseek/chat-reasoning-tool-call-cache-hit.sse",
        "tool-calls",
        U(339 - 320, 83 - 39, 320, 39),
        [
            ReasoningBlock(
                "The user is asking for the weather in San Francisco. I need to use the "
                "weather tool to get this information. Let me invoke the weather tool "
                'with the location parameter set to "San Francisco".'
            ),
            ToolCallBlock(
                "call_00_ioIn7yN9p1ZOMNpDLwd4MgAF", "weather", '{"location": "San Francisco"}'
            ),
        ],
    ),
    Case(
        "deepseek/chat-finish-length.sse",
        "max-tokens",
        U(13, 400, 0, None),
        None,
        ["## **Holiday Name:** Starlight Remembrance"],
        [" looking at"],
        ["text"],
    ),
    # OpenRouter: cached_tokens 679 of 687 prompt tokens; 118 of 187 completion tokens reasoning.
    Case(
        "openrouter/chat-cached-tokens-usage.sse",
        "stop",
        U(687 - 679, 187 - 118, 679, 118),
        None,
        ["I'm Grok, an AI built by xAI."],
        ["What's on your mind?"],
        ["text"],
    ),
    # vLLM: finish_reason on the last content chunk itself.
    Case(
        "vllm/chat-finish-length-stop-reason-null.sse",
        "max-tokens",
        None,
        [TextBlock("<|im_end|>doctor\n<|im_end|>supervisor\n<")],
    ),
    # Errors mid-stream: what arrived stays emitted (an unfinished block), then finish {error}.
    Case(
        "groq/chat-midstream-error-tool-use-failed.sse",
        "error",
        None,
        None,
        ["We need to call"],
        [" Let's do that."],
        ["reasoning"],
        StepError(
            "Tool call validation failed: tool call validation failed: parameters for "
            "tool get_something_by_name did not match schema: errors: [missing "
            "properties: 'name', additionalProperties 'invalid_param' not allowed]",
            retryable=False,
            code="tool_use_failed",
        ),
    ),
    # 11 reasoning tokens reported against 10 completion tokens: not folded in, so kept as is.
    Case(
        "openrouter/chat-midstream-error-finish-length.sse",
        "error",
        U(43, 10, 0, 11),
        None,
        ["We need to respond to a greeting. The user"],
        [""],
        ["reasoning"],
        StepError("Token limit reached", retryable=False, code="400"),
    ),
]
IDS = [c.path for c in CASES]


def body_of(recordings: Path, case: Case) -> bytes:
    return (recordings / case.path).read_bytes()


def check_expected(case: Case, chunks: list[StreamChunk]) -> None:
    check_contract(chunks)
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert finish.reason == case.finish
    assert finish.error == case.error
    usages = only(chunks, Usage)
    assert [u.usage for u in usages] == ([case.usage] if case.usage else [])
    rebuilt = rebuild_blocks(chunks)
    if case.finish == "max-tokens":  # the cut block stays open; the others say their deltas
        assert [b for b in ended_blocks(chunks) if b not in rebuilt.values()] == []
    elif case.finish != "error":  # every block closed, and its block-end says what its deltas say
        assert ended_blocks(chunks) == [rebuilt[i] for i in sorted(rebuilt)]
    blocks = [rebuilt[i] for i in sorted(rebuilt)]
    if case.blocks is not None:
        assert blocks == case.blocks
        return
    kind_of = {TextBlock: "text", ReasoningBlock: "reasoning", ToolCallBlock: "tool-call"}
    assert [kind_of[type(b)] for b in blocks] == case.kinds
    for block, start, end in zip(blocks, case.starts, case.ends, strict=True):
        assert isinstance(block, TextBlock | ReasoningBlock)
        assert block.text.startswith(start), (block.text[:80], start)
        assert block.text.endswith(end), (block.text[-80:], end)


def check_folded(case: Case, chunks: list[StreamChunk]) -> None:
    result = fold(chunks)
    if case.error is not None:
        assert result == RecordedError(
            kind="provider",
            message=case.error.message,
            retryable=case.error.retryable,
            code=case.error.code,
            usage=case.usage,
        )
        return
    assert isinstance(result, Message)
    assert result.finish_reason == case.finish
    assert result.usage == case.usage
    rebuilt = rebuild_blocks(chunks)
    assert result.content == [rebuilt[i] for i in sorted(rebuilt)]
    if case.finish == "max-tokens":  # the cut: the last block, never ended by the provider
        assert result.truncated_blocks == ([max(rebuilt)] if rebuilt else [])
    if case.blocks is not None:
        assert result.content == case.blocks


@pytest.mark.parametrize("case", CASES, ids=IDS)
async def test_recording_over_a_socket_split_at_random(
    recordings: Path, recording_server: RecordingServer, case: Case
) -> None:
    body = body_of(recordings, case)
    rnd = random.Random(f"{SEED}:{case.path}")
    cuts = random_cuts(len(body), rnd)
    print(f"seed={SEED} cuts={cuts}")
    chunks = await stream_over_socket(recording_server, Route(body, cuts), OpenAIChatNormaliser())
    check_expected(case, chunks)
    check_folded(case, chunks)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_recording_any_split_gives_the_same_chunks(recordings: Path, case: Case) -> None:
    body = body_of(recordings, case)
    whole = normalise_bytes(body, OpenAIChatNormaliser(), [])
    check_expected(case, whole)
    rnd = random.Random(f"{SEED}:{case.path}:splits")
    print(f"seed={SEED}")
    for _ in range(15):
        assert normalise_bytes(body, OpenAIChatNormaliser(), random_cuts(len(body), rnd)) == whole


def sdk_snapshot(body: bytes):
    """The openai SDK's own accumulation of the stream (an independent implementation)."""
    state = ChatCompletionStreamState()
    for block in body.decode().split("\n\n"):
        for line in block.split("\n"):
            if line.startswith("data: ") and line != "data: [DONE]":
                data = json.loads(line[6:])
                if data.get("object") != "text_completion" and "error" not in data:
                    parsed = construct_type(type_=ChatCompletionChunk, value=data)
                    assert isinstance(parsed, ChatCompletionChunk)
                    state.handle_chunk(parsed)
    return state.current_completion_snapshot.choices[0]


SDK_CASES = [
    c
    for c in CASES
    if c.error is None and "legacy" not in c.path and "reasoning-only" not in c.path
]


@pytest.mark.parametrize("case", SDK_CASES, ids=[c.path for c in SDK_CASES])
def test_blocks_match_the_openai_sdk_accumulator(recordings: Path, case: Case) -> None:
    choice = sdk_snapshot(body_of(recordings, case))
    chunks = normalise_bytes(body_of(recordings, case), OpenAIChatNormaliser(), [])
    blocks = list(ended_or_cut(chunks).values())
    text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
    assert text == (choice.message.content or choice.message.refusal or "")
    extra = choice.message.model_extra or {}
    reasoning = extra.get("reasoning_content") or extra.get("reasoning") or ""
    assert "".join(b.text for b in blocks if isinstance(b, ReasoningBlock)) == reasoning
    calls = [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    assert [(b.id, b.name, b.arguments) for b in blocks if isinstance(b, ToolCallBlock)] == calls
    sdk_reason: dict[str, FinishReason] = {
        "stop": "stop",
        "length": "max-tokens",
        "tool_calls": "tool-calls",
    }
    expected: FinishReason = (
        "refusal" if choice.message.refusal else sdk_reason[choice.finish_reason]
    )
    assert chunks[-1] == Finish(reason=expected)


# --- synthetic streams: the error paths and the mappings no recording shows ---


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra) -> SseEvent:
    choice = {"index": 0, "delta": delta or {}, "finish_reason": finish}
    return SseEvent(data=json.dumps({"choices": [choice], **extra}))


DONE = SseEvent(data="[DONE]")


def run(*events: SseEvent, close: bool = True) -> list[StreamChunk]:
    return normalise_events(OpenAIChatNormaliser(), events, close=close)


def test_body_ending_without_finish_is_an_error_after_what_arrived() -> None:
    out = run(chunk({"content": "Hel"}), chunk({"content": "lo"}))
    assert out[:3] == [
        only(out, type(out[0]))[0],
        TextDelta(index=0, text="Hel"),
        TextDelta(index=0, text="lo"),
    ]
    assert out[-1] == Finish(
        reason="error",
        error=StepError("stream ended before the provider finished", retryable=True),
    )
    check_contract(out)


def test_undecodable_json_mid_stream_ends_the_step() -> None:
    out = run(
        chunk({"content": "a"}), SseEvent(data='{"choices": [{"delta": '), chunk({"content": "b"})
    )
    check_contract(out)
    assert [c for c in out if isinstance(c, TextDelta)] == [TextDelta(index=0, text="a")]
    finish = out[-1]
    assert isinstance(finish, Finish)
    assert finish.error is not None
    assert finish.error.retryable is False
    assert finish.error.message.startswith("undecodable chunk from provider")


def test_nothing_after_finish_even_if_the_provider_keeps_talking() -> None:
    norm = OpenAIChatNormaliser()
    assert norm.feed(chunk({"content": "x"}, "stop"))
    assert norm.feed(DONE)[-1] == Finish(reason="stop")
    assert norm.feed(chunk({"content": "late"})) == []
    assert norm.close() == []


def test_finish_reason_without_done_still_finishes_normally() -> None:
    out = run(chunk({"content": "x"}, "content_filter"))
    assert out[-1] == Finish(reason="content-filter")


def test_done_without_finish_reason_is_an_error() -> None:
    out = run(chunk({"content": "x"}), DONE)
    assert isinstance(out[-1], Finish)
    assert out[-1].reason == "error"


def test_interleaved_tool_calls_keep_their_own_blocks_and_raw_bytes() -> None:
    def call(i: int, args: str, ident: str | None = None, name: str | None = None) -> SseEvent:
        fn = {"arguments": args} | ({"name": name} if name else {})
        tc = {"index": i, "function": fn} | ({"id": ident} if ident else {})
        return chunk({"tool_calls": [tc]})

    out = run(
        call(0, '{"a":', "c0", "f"),
        call(1, '{"b": ', "c1", "g"),
        call(0, " 1.50 }"),
        call(1, '"\\u00e9"}'),
        chunk(finish="stop"),
        DONE,
    )
    check_contract(out)
    assert ended_blocks(out) == [
        ToolCallBlock("c0", "f", '{"a": 1.50 }'),
        ToolCallBlock("c1", "g", '{"b": "\\u00e9"}'),
    ]
    assert only(out, ToolCallDelta)[2] == ToolCallDelta(index=0, id="c0", arguments_delta=" 1.50 }")
    # Compatible servers that answer "stop" after tool calls still mean tool calls.
    assert out[-1] == Finish(reason="tool-calls")


def test_groq_style_error_event_without_wrapper_and_retryable_codes() -> None:
    out = run(SseEvent(event="error", data='{"message": "busy", "type": "overloaded_error"}'))
    assert out == [
        Finish(reason="error", error=StepError("busy", retryable=True, code="overloaded_error"))
    ]
    out = run(SseEvent(event="error", data='{"error": {"message": "slow down", "code": 429}}'))
    assert out[-1] == Finish(
        reason="error", error=StepError("slow down", retryable=True, code="429")
    )


def test_usage_counts_not_sent_stay_absent() -> None:
    out = run(
        chunk({"content": "x"}, "stop", usage={"prompt_tokens": 5, "completion_tokens": 2}), DONE
    )
    assert only(out, Usage) == [Usage(TokenUsage(input_tokens=5, output_tokens=2))]


def test_every_chat_recording_is_covered(recordings: Path) -> None:
    folders = ("openai", "deepseek", "azure-openai", "groq", "openrouter", "vllm")
    on_disk = sorted(f"{d}/{p.name}" for d in folders for p in (recordings / d).glob("*.sse"))
    assert on_disk == sorted(IDS)
