"""The session events the store keeps: every chunk, every message, every recorded error."""

from __future__ import annotations

import msgspec

from tokenwire.schemas._envelope import ChunkEnvelope
from tokenwire.schemas._message import Message, RecordedError
from tokenwire.schemas._routed import Routed


class ChunkEvent(msgspec.Struct, tag="chunk", tag_field="type", frozen=True):
    """One chunk of the session, at its per-session sequence number ``seq`` (from 1)."""

    seq: int
    envelope: ChunkEnvelope


class MessageEvent(msgspec.Struct, tag="message", tag_field="type", frozen=True):
    """An assembled message, citing the chunks ``seq_start..seq_end`` it came from;
    ``routed``: how a routed step reached its provider (its first chunk's, when stored)."""

    session: str
    turn: int
    step: int
    seq_start: int
    seq_end: int
    provider: str
    model: str
    message: Message
    routed: Routed | msgspec.UnsetType = msgspec.UNSET


class ErrorEvent(msgspec.Struct, tag="error", tag_field="type", frozen=True):
    """A failed step's recorded error, citing the chunks ``seq_start..seq_end`` it saw.

    A step that saw no chunk at all has ``seq_end == seq_start - 1``. ``routed`` as on
    :class:`MessageEvent`.
    """

    session: str
    turn: int
    step: int
    seq_start: int
    seq_end: int
    provider: str
    model: str
    error: RecordedError
    routed: Routed | msgspec.UnsetType = msgspec.UNSET


SessionEvent = ChunkEvent | MessageEvent | ErrorEvent
"""The closed union of stored session events, tagged by ``type``."""
