"""Recorded-like sessions for the replay tests: a script whose text is written down here.

Each step's chunks are built from literal strings (split into fragments); the test oracle is
the literal text itself, never our own output.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import msgspec
from nats.aio.client import Client

from tests.fixtures.frames import framed
from tokenwire.broker import ChunkPublisher, Topology
from tokenwire.fold import fold
from tokenwire.replay import ReplayEvent
from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    ChunkEnvelope,
    Finish,
    ReasoningBlock,
    ReasoningDelta,
    StepError,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallBlock,
    ToolCallDelta,
    Usage,
    json_encoder,
)
from tokenwire.store import StepRecord, Store

T0 = 1_700_000_000_000_000_000
CHUNK_GAP_NS = 20_000_000  # 20 ms between chunks
TTFC_NS = 250_000_000  # the first chunk 250 ms after the request

# The ground truth: what the user saw, step by step, written down.
REASONING_0 = "The user asks about Paris weather; I should call both tools."
TEXT_0 = "Let me check the weather and the local time in Paris."
CALLS_0 = (
    ToolCallBlock(id="call_w", name="get_weather", arguments='{"city": "Paris", "unit": "C"}'),
    ToolCallBlock(id="call_t", name="get_time", arguments='{"tz": "Europe/Paris"}'),
)
TEXT_1 = "It is 18 °C and sunny in Paris — 14:05 local time. Enjoy the walk! 🌤"
TEXT_2 = "Here is the long answer that was cut "
TRUNCATED_CALL = ToolCallBlock(id="call_x", name="search", arguments='{"q": "cafés near Lou')
ERROR_TEXT_3 = "Retrying after "
ERROR_3 = StepError(message="upstream overloaded", retryable=True, code="overloaded_error")

EXPECTED_TEXT = {(0, 0): TEXT_0, (1, 0): TEXT_1, (1, 1): TEXT_2, (2, 0): ERROR_TEXT_3}
EXPECTED_REASONING = {(0, 0): REASONING_0}


def split(text: str, size: int = 4) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _tool_fragments(index: int, call: ToolCallBlock) -> list[ToolCallDelta]:
    parts = split(call.arguments, 7)
    first = ToolCallDelta(index=index, id=call.id, name=call.name, arguments_delta=parts[0])
    return [first] + [ToolCallDelta(index=index, id=call.id, arguments_delta=p) for p in parts[1:]]


def step_0() -> list[StreamChunk]:
    """Reasoning, text, two interleaved tool calls with block-ends, finish tool-calls."""
    chunks: list[StreamChunk] = [BlockStart(index=0, block_type="reasoning")]
    chunks += [ReasoningDelta(index=0, text=t) for t in split(REASONING_0)]
    chunks += [
        BlockEnd(index=0, block=ReasoningBlock(REASONING_0, signature="sig")),
        BlockStart(index=1, block_type="text"),
    ]
    chunks += [TextDelta(index=1, text=t) for t in split(TEXT_0)]
    chunks.append(BlockEnd(index=1, block=TextBlock(TEXT_0)))
    a, b = _tool_fragments(2, CALLS_0[0]), _tool_fragments(3, CALLS_0[1])
    for i in range(max(len(a), len(b))):  # parallel calls interleave
        chunks += a[i : i + 1] + b[i : i + 1]
    chunks += [BlockEnd(index=2, block=CALLS_0[0]), BlockEnd(index=3, block=CALLS_0[1])]
    chunks += [Usage(TokenUsage(input_tokens=120, output_tokens=60)), Finish(reason="tool-calls")]
    return chunks


def step_1() -> list[StreamChunk]:
    """Delta-only text (no block-start/end), usage, finish stop."""
    chunks: list[StreamChunk] = [TextDelta(index=0, text=t) for t in split(TEXT_1, 3)]
    return [*chunks, Usage(TokenUsage(input_tokens=200, output_tokens=30)), Finish("stop")]


def step_2() -> list[StreamChunk]:
    """Text, then a tool call truncated by max-tokens (dropped, never shown)."""
    chunks: list[StreamChunk] = [TextDelta(index=0, text=t) for t in split(TEXT_2)]
    return [*chunks, *_tool_fragments(1, TRUNCATED_CALL), Finish(reason="max-tokens")]


def step_3() -> list[StreamChunk]:
    """Some text, then a provider error."""
    chunks: list[StreamChunk] = [TextDelta(index=0, text=t) for t in split(ERROR_TEXT_3)]
    return [*chunks, Finish(reason="error", error=ERROR_3)]


SCRIPT: dict[tuple[int, int], list[StreamChunk]] = {
    (0, 0): step_0(),
    (1, 0): step_1(),
    (1, 1): step_2(),
    (2, 0): step_3(),
}


def envelopes(
    session: str, script: dict[tuple[int, int], list[StreamChunk]] | None = None, t0: int = T0
) -> list[ChunkEnvelope]:
    """The script's chunks as envelopes, steps one after the other, 20 ms apart."""
    out: list[ChunkEnvelope] = []
    now = t0
    for (turn, step), chunks in (script or SCRIPT).items():
        request = now
        now += TTFC_NS
        for ordinal, chunk in enumerate(chunks):
            first = request if ordinal == 0 else None
            out.append(
                ChunkEnvelope(
                    session,
                    turn,
                    step,
                    ordinal,
                    now,
                    "scripted",
                    "tools",
                    chunk,
                    request_time_ns=first,
                )
            )
            now += CHUNK_GAP_NS
    return out


async def publish(
    nc: Client, topology: Topology, items: Iterable[ChunkEnvelope], frame_size: int = 0
) -> int:
    """Publish envelopes in the given order (the broker stores them in that order); with a
    ``frame_size``, in frames of that many chunks (each step's first chunk alone). Returns
    the number of messages."""
    publisher = await ChunkPublisher(nc, topology).start()
    count = 0
    messages = (
        framed(items, frame_size)
        if frame_size
        else ((env, json_encoder.encode(env)) for env in items)
    )
    try:
        for env, payload in messages:
            await publisher.publish(
                payload, env.session, env.turn, env.step, env.ordinal, first=env.ordinal == 0
            )
            count += 1
        await publisher.flush(30)
    finally:
        await publisher.close()
    return count


def by_step(items: Sequence[ChunkEnvelope]) -> dict[tuple[int, int], list[ChunkEnvelope]]:
    steps: defaultdict[tuple[int, int], list[ChunkEnvelope]] = defaultdict(list)
    for env in items:
        steps[env.turn, env.step].append(env)
    return {k: sorted(v, key=lambda e: e.ordinal) for k, v in steps.items()}


async def commit_folded(store: Store, items: Sequence[ChunkEnvelope]) -> None:
    """Fill the store as the assembler would: each step's chunks and the fold of them."""
    records = []
    for (turn, step), chunks in by_step(items).items():
        outcome = fold(e.chunk for e in chunks)
        records.append(
            StepRecord(
                chunks[0].session,
                turn,
                step,
                "scripted",
                "tools",
                chunks,
                outcome,
                chunks[-1].time_ns,
            )
        )
    await store.commit(records)


@dataclass
class Seen:
    """What replay events showed, per step."""

    text: dict[tuple[int, int], str]
    reasoning: dict[tuple[int, int], str]
    calls: dict[tuple[int, int], list[ToolCallBlock]]
    ends: dict[tuple[int, int], object]
    ttfc: dict[tuple[int, int], float | None]


def seen(events: Iterable[object]) -> Seen:
    """Accumulate what replay events (ReplayEvent) showed."""
    from tokenwire.replay import (
        ReplayEvent,
        ShownError,
        ShownFinish,
        ShownReasoning,
        ShownStepStart,
        ShownText,
        ShownToolCall,
    )

    out = Seen(defaultdict(str), defaultdict(str), defaultdict(list), {}, {})
    for event in events:
        assert isinstance(event, ReplayEvent)
        key = event.step_key
        for shown in event.shown:
            if isinstance(shown, ShownText):
                out.text[key] += shown.text
            elif isinstance(shown, ShownReasoning):
                out.reasoning[key] += shown.text
            elif isinstance(shown, ShownToolCall):
                out.calls[key].append(shown.call)
            elif isinstance(shown, ShownFinish | ShownError):
                out.ends[key] = shown
            elif isinstance(shown, ShownStepStart):
                out.ttfc[key] = shown.time_to_first_chunk_s
    return out


def queued_event(frame: bytes) -> ReplayEvent:
    """The event an SSE frame of the client queue carries (``id: ...\\nevent: chunk\\ndata:
    <json>\\n\\n``), decoded back into a ReplayEvent."""
    data = frame.split(b"\ndata: ", 1)[1].rstrip(b"\n")
    return msgspec.json.decode(data, type=ReplayEvent)
