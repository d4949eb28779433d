"""The wire contract: stream chunks, content blocks, messages and the events around them.

This package imports only msgspec and the standard library; everything else imports it.
Decoders are built once here and shared.
"""

from __future__ import annotations

import msgspec as _msgspec

from tokenwire.schemas._blocks import (
    BlockType,
    ContentBlock,
    ImageBlock,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)
from tokenwire.schemas._chunks import (
    FINISH_REASONS,
    LIMIT_ERROR_CODE,
    BlockEnd,
    BlockStart,
    Finish,
    FinishReason,
    ReasoningDelta,
    StepError,
    StreamChunk,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from tokenwire.schemas._envelope import (
    ENVELOPE_VERSION,
    SCHEMA_VERSION,
    ChunkEnvelope,
    StepLink,
    StepPersisted,
    StreamStarted,
)
from tokenwire.schemas._events import ChunkEvent, ErrorEvent, MessageEvent, SessionEvent
from tokenwire.schemas._frame import (
    FRAME_TAIL,
    FRAME_VERSION,
    ChunkFrame,
    FramedChunk,
    chunk_envelopes,
    frame_decoder,
    frame_head,
    frame_item,
)
from tokenwire.schemas._keys import NO_LIMITS, Budget, KeyRecord, Limits, TenantRecord
from tokenwire.schemas._message import Message, RecordedError, StepErrorKind
from tokenwire.schemas._routed import AttemptFailure, DeploymentPrice, FailedAttempt, Routed
from tokenwire.schemas._usage import TokenUsage

__all__ = [
    "ENVELOPE_VERSION",
    "FINISH_REASONS",
    "FRAME_TAIL",
    "FRAME_VERSION",
    "LIMIT_ERROR_CODE",
    "NO_LIMITS",
    "SCHEMA_VERSION",
    "AttemptFailure",
    "BlockEnd",
    "BlockStart",
    "BlockType",
    "Budget",
    "ChunkEnvelope",
    "ChunkEvent",
    "ChunkFrame",
    "ContentBlock",
    "DeploymentPrice",
    "ErrorEvent",
    "FailedAttempt",
    "Finish",
    "FinishReason",
    "FramedChunk",
    "ImageBlock",
    "KeyRecord",
    "Limits",
    "Message",
    "MessageEvent",
    "ReasoningBlock",
    "ReasoningDelta",
    "RecordedError",
    "Routed",
    "SessionEvent",
    "StepError",
    "StepErrorKind",
    "StepLink",
    "StepPersisted",
    "StreamChunk",
    "StreamStarted",
    "TenantRecord",
    "TextBlock",
    "TextDelta",
    "TokenUsage",
    "ToolCallBlock",
    "ToolCallDelta",
    "ToolResultBlock",
    "Usage",
    "chunk_decoder",
    "chunk_envelopes",
    "envelope_decoder",
    "event_decoder",
    "frame_decoder",
    "frame_head",
    "frame_item",
    "json_encoder",
]

json_encoder = _msgspec.json.Encoder()
"""The one JSON encoder for every wire type."""

chunk_decoder: _msgspec.json.Decoder[StreamChunk] = _msgspec.json.Decoder(StreamChunk)
"""Decodes one stream chunk (the ``tokenwire fold`` JSONL format)."""

envelope_decoder: _msgspec.json.Decoder[ChunkEnvelope] = _msgspec.json.Decoder(ChunkEnvelope)
"""Decodes one version-1 chunk message (a single envelope). Readers of the chunk stream use
:func:`chunk_envelopes`, which reads version 1 and version 2 (frames) alike."""

event_decoder: _msgspec.json.Decoder[SessionEvent] = _msgspec.json.Decoder(SessionEvent)
"""Decodes one stored session event."""
