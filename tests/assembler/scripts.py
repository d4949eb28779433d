"""Scripted steps: the chunks a step sends and, written down independently, what it must become.

The expected outcome of each script is spelled out by hand from the script's inputs (the text
pieces joined, the tool calls as sent), never computed by the fold under test.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    ChunkEnvelope,
    ContentBlock,
    Finish,
    Message,
    ReasoningBlock,
    ReasoningDelta,
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


@dataclass(frozen=True)
class Script:
    """One step's chunks (in ordinal order) and the outcome they must fold to."""

    chunks: list[StreamChunk]
    expected: Message | RecordedError


def text_step(pieces: list[str]) -> Script:
    usage = TokenUsage(input_tokens=12, output_tokens=len(pieces))
    chunks: list[StreamChunk] = [TextDelta(index=0, text=p) for p in pieces]
    chunks += [Usage(usage=usage), Finish(reason="stop")]
    return Script(chunks, Message([TextBlock("".join(pieces))], "stop", usage=usage))


def reasoning_step(thought: list[str], answer: list[str]) -> Script:
    usage = TokenUsage(input_tokens=5, output_tokens=3, reasoning_tokens=len(thought))
    block = ReasoningBlock("".join(thought), signature="sig-1")
    chunks: list[StreamChunk] = [BlockStart(index=0, block_type="reasoning")]
    chunks += [ReasoningDelta(index=0, text=t) for t in thought]
    chunks += [BlockEnd(index=0, block=block), BlockStart(index=1, block_type="text")]
    chunks += [TextDelta(index=1, text=a) for a in answer]
    chunks += [BlockEnd(index=1, block=TextBlock("".join(answer)))]
    chunks += [Usage(usage=usage), Finish(reason="stop")]
    return Script(chunks, Message([block, TextBlock("".join(answer))], "stop", usage=usage))


def tools_step(city: str) -> Script:
    """Two tool calls whose fragments interleave (index 0 and 1)."""
    chunks: list[StreamChunk] = [
        ToolCallDelta(index=0, id="call_a", name="get_weather", arguments_delta='{"ci'),
        ToolCallDelta(index=1, id="call_b", name="get_time", arguments_delta='{"tz'),
        ToolCallDelta(index=0, id="call_a", arguments_delta=f'ty": "{city}"}}'),
        ToolCallDelta(index=1, id="call_b", arguments_delta='": "UTC"}'),
        Finish(reason="tool-calls"),
    ]
    calls = [
        ToolCallBlock("call_a", "get_weather", f'{{"city": "{city}"}}'),
        ToolCallBlock("call_b", "get_time", '{"tz": "UTC"}'),
    ]
    return Script(chunks, Message(list(calls), "tool-calls"))


def max_tokens_step() -> Script:
    """A max-tokens finish: the truncated tool call is dropped, the text kept."""
    chunks: list[StreamChunk] = [
        TextDelta(index=0, text="Let me "),
        TextDelta(index=0, text="search."),
        ToolCallDelta(index=1, id="call_c", name="search", arguments_delta='{"q": "tru'),
        Finish(reason="max-tokens"),
    ]
    dropped = [ToolCallBlock("call_c", "search", '{"q": "tru')]
    text: list[ContentBlock] = [TextBlock("Let me search.")]
    # Both blocks were still open at the finish (no block-end): the cut the message records.
    return Script(
        chunks, Message(text, "max-tokens", dropped_tool_calls=dropped, truncated_blocks=[0, 1])
    )


def error_step() -> Script:
    chunks: list[StreamChunk] = [
        TextDelta(index=0, text="partial"),
        Finish(reason="error", error=StepError("overloaded", True, "overloaded_error")),
    ]
    return Script(chunks, RecordedError("provider", "overloaded", True, "overloaded_error"))


def random_script(rng: random.Random) -> Script:
    """One of the five kinds, with random text."""
    words = ["alpha ", "beta ", "gamma ", "δέλτα ", "epsilon ", "zeta ", "eta "]
    kind = rng.randrange(5)
    if kind == 0:
        return text_step([rng.choice(words) for _ in range(rng.randint(1, 40))])
    if kind == 1:
        return reasoning_step([rng.choice(words) for _ in range(rng.randint(1, 10))], ["ok"])
    if kind == 2:
        return tools_step(rng.choice(["Paris", "Lima", "Oslo"]))
    if kind == 3:
        return max_tokens_step()
    return error_step()


def envelopes(
    session: str, turn: int, step: int, script: Script, t0: int = 1_700_000_000_000_000_000
) -> list[ChunkEnvelope]:
    """The script's chunks as the gateway would publish them: ordinals 0.. in order."""
    return [
        ChunkEnvelope(
            session=session,
            turn=turn,
            step=step,
            ordinal=i,
            time_ns=t0 + i * 1000,
            provider="scripted",
            model="m-1",
            chunk=chunk,
            request_time_ns=t0 - 5000 if i == 0 else None,
        )
        for i, chunk in enumerate(script.chunks)
    ]
