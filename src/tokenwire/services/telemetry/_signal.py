"""The stream-started signal, built from a step's first chunk. It never carries content."""

from __future__ import annotations

from typing import assert_never

from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    BlockType,
    ChunkEnvelope,
    Finish,
    ImageBlock,
    ReasoningBlock,
    ReasoningDelta,
    StepError,
    StreamChunk,
    StreamStarted,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallDelta,
    ToolResultBlock,
    Usage,
)


def failed_call(envelope: ChunkEnvelope) -> StepError | None:
    """The error when the step's first chunk is ``finish {error}``: a failed call, not a stream
    start (docs/telemetry.md, "First chunk")."""
    chunk = envelope.chunk
    return chunk.error if isinstance(chunk, Finish) else None


def stream_started(envelope: ChunkEnvelope, traceparent: str | None) -> StreamStarted:
    """The signal for the step whose first chunk is ``envelope``.

    Only identity, timing and the *type* of the first block are copied: no text, arguments or
    any other content can reach the signal by construction.
    """
    ttfc = None
    if envelope.request_time_ns is not None:
        ttfc = max(0, envelope.time_ns - envelope.request_time_ns) / 1e9
    return StreamStarted(
        session=envelope.session,
        turn=envelope.turn,
        step=envelope.step,
        provider=envelope.provider,
        model=envelope.model,
        first_chunk_time_ns=envelope.time_ns,
        first_block_type=first_block_type(envelope.chunk),
        request_time_ns=envelope.request_time_ns,
        time_to_first_chunk_s=ttfc,
        traceparent=traceparent,
    )


def first_block_type(chunk: StreamChunk) -> BlockType | None:
    """The type of block a first chunk opens; None when the step opened with no block."""
    match chunk:
        case BlockStart(block_type=block_type):
            return block_type
        case TextDelta():
            return "text"
        case ReasoningDelta():
            return "reasoning"
        case ToolCallDelta():
            return "tool-call"
        case BlockEnd(block=block):
            return _block_type(block)
        case Usage() | Finish():
            return None
        case _:
            assert_never(chunk)


def _block_type(
    block: TextBlock | ReasoningBlock | ToolCallBlock | ToolResultBlock | ImageBlock,
) -> BlockType:
    match block:
        case TextBlock():
            return "text"
        case ReasoningBlock():
            return "reasoning"
        case ToolCallBlock():
            return "tool-call"
        case ToolResultBlock():
            return "tool-result"
        case ImageBlock():
            return "image"
        case _:
            assert_never(block)
