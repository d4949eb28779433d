"""What travels on the broker: the chunk envelope and the small events around it."""

from __future__ import annotations

from typing import Literal

import msgspec

from tokenwire.schemas._blocks import BlockType
from tokenwire.schemas._chunks import StreamChunk
from tokenwire.schemas._routed import Routed

SCHEMA_VERSION = 2
"""The version of the wire contract this code writes. Readers accept every version up to it.

Version 2 added the chunk frame (``ChunkFrame``: several chunks of one step in one broker
message); a single ``ChunkEnvelope`` on the broker is version 1 (``ENVELOPE_VERSION``)."""

ENVELOPE_VERSION = 1
"""The ``v`` of a single-chunk broker message (a ``ChunkEnvelope`` alone): version 1's shape,
still written when frames are off and read by every version."""


class StepLink(msgspec.Struct, frozen=True):
    """A step named from another step: ``session``, ``turn``, ``step``. A step's ``parent`` is
    the step whose tool calls it answers, or whose answer it continues, or the previous step of
    its turn; a sub-agent's first step names a step of another session (docs/gateway.md,
    "Threading")."""

    session: str
    turn: int
    step: int

    def __str__(self) -> str:
        return f"{self.session}/{self.turn}/{self.step}"


class ChunkEnvelope(msgspec.Struct, frozen=True):
    """One stream chunk with the identity and timing it travels with.

    ``ordinal`` numbers the chunks of one (session, turn, step) from 0 with no gaps;
    consumers detect missing, duplicated and out-of-order chunks from it. ``time_ns`` is the
    gateway's wall clock (Unix ns) when it normalised the chunk; ``request_time_ns`` is when
    the gateway received the request, set on ordinal 0 so that time to first chunk can be read
    off the first chunk alone. ``key_name`` and ``tenant`` name the gateway key that made the
    request (never the key itself) and its tenant, also on ordinal 0 only: the step's owner,
    for scoped reads and the usage ledger. Unset (left off the wire) on every other chunk and
    when the gateway runs without named keys. ``parent`` (ordinal 0 only) is the step this one
    follows (:class:`StepLink`); unset when it has none (a conversation's first step).
    ``routed`` (ordinal 0 of a step whose model the routes file names): the deployment that
    answered and the attempts that failed before it.
    """

    session: str
    turn: int
    step: int
    ordinal: int
    time_ns: int
    provider: str
    model: str
    chunk: StreamChunk
    v: int = ENVELOPE_VERSION
    request_time_ns: int | None = None
    key_name: str | msgspec.UnsetType = msgspec.UNSET
    tenant: str | msgspec.UnsetType = msgspec.UNSET
    parent: StepLink | msgspec.UnsetType = msgspec.UNSET
    routed: Routed | msgspec.UnsetType = msgspec.UNSET


class StepPersisted(msgspec.Struct, frozen=True):
    """Published by the assembler after the store committed a step: it is durable now."""

    session: str
    turn: int
    step: int
    outcome: Literal["message", "error"]
    seq_start: int
    seq_end: int
    v: int = SCHEMA_VERSION


class StreamStarted(msgspec.Struct, frozen=True):
    """The telemetry signal: a step's stream started. Never carries content."""

    session: str
    turn: int
    step: int
    provider: str
    model: str
    first_chunk_time_ns: int
    first_block_type: BlockType | None
    request_time_ns: int | None = None
    time_to_first_chunk_s: float | None = None
    traceparent: str | None = None
    v: int = SCHEMA_VERSION
