"""Schema version 2 on the broker: a frame, several consecutive chunks of one step in one
message, and :func:`chunk_envelopes`, the one way every reader turns a stored message (v1 or
v2) into the chunk envelopes it carries.

A frame writes the step's fields (session, turn, step, provider, model, and on ordinal 0 the
request time and the step's owner) once, then one ``[dt_ns, chunk]`` pair per chunk. Chunk
``i`` of a frame has the ordinal ``ordinal + i`` and the time ``time_ns + dt_ns``: each chunk
keeps its own ordinal and its own time, exactly (ADR 0024).
"""

from __future__ import annotations

import msgspec

from tokenwire.schemas._chunks import StreamChunk, Usage
from tokenwire.schemas._envelope import ENVELOPE_VERSION, ChunkEnvelope, StepLink
from tokenwire.schemas._routed import Routed
from tokenwire.schemas._usage import TokenUsage

FRAME_VERSION = 2
"""The ``v`` of a frame: the first schema version with frames."""

_FRAME_PREFIX = b'{"v":2,'
"""How this package's encoder begins every frame (the tag first): the fast path of
:func:`chunk_envelopes`. Other writers may order the keys as they like; they take the
general path."""


class FramedChunk(msgspec.Struct, frozen=True, array_like=True):
    """One chunk in a frame, on the wire ``[dt_ns, chunk]``: ``dt_ns`` is its time after the
    frame's ``time_ns`` (0 for the first; nanoseconds, so the time is kept exactly)."""

    dt_ns: int
    chunk: StreamChunk


class ChunkFrame(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag_field="v", tag=2
):
    """Consecutive chunks of one (session, turn, step) in one broker message (``v`` 2).

    ``ordinal`` and ``time_ns`` are the first chunk's; ``chunks[i]`` has the ordinal
    ``ordinal + i`` and the time ``time_ns + chunks[i].dt_ns``. ``request_time_ns``,
    ``key_name``, ``tenant``, ``parent`` and ``routed`` are set only on the frame that carries
    ordinal 0 (which the gateway always sends alone), as on the v1 envelope. At least one chunk.

    >>> from tokenwire.schemas import TextDelta
    >>> items = [FramedChunk(0, TextDelta(0, "a")), FramedChunk(7, TextDelta(0, "b"))]
    >>> frame = ChunkFrame(session="s", turn=0, step=0, ordinal=3, time_ns=100,
    ...                    provider="p", model="m", chunks=items)
    >>> [(e.ordinal, e.time_ns, e.chunk.text) for e in frame.envelopes()]
    [(3, 100, 'a'), (4, 107, 'b')]
    """

    session: str
    turn: int
    step: int
    ordinal: int
    time_ns: int
    provider: str
    model: str
    request_time_ns: int | None = None
    key_name: str | msgspec.UnsetType = msgspec.UNSET
    tenant: str | msgspec.UnsetType = msgspec.UNSET
    parent: StepLink | msgspec.UnsetType = msgspec.UNSET
    routed: Routed | msgspec.UnsetType = msgspec.UNSET
    chunks: list[FramedChunk]

    def __post_init__(self) -> None:
        if not self.chunks:
            raise ValueError("a frame carries at least one chunk")

    def envelopes(self) -> list[ChunkEnvelope]:
        """The frame's chunks as envelopes, in ordinal order. Each is exactly the envelope the
        same chunk would have been alone (``v`` 1, the single envelope's shape): the frame is
        how chunks travel, not what they are, so the store's chunk log, verify and the events
        feed see the same envelopes whether the gateway framed them or not."""
        session, turn, step, t0 = self.session, self.turn, self.step, self.time_ns
        provider, model, first = self.provider, self.model, self.ordinal
        out = [
            ChunkEnvelope(
                session,
                turn,
                step,
                first + i,
                t0 + item.dt_ns,
                provider,
                model,
                item.chunk,
                ENVELOPE_VERSION,
            )
            for i, item in enumerate(self.chunks)
        ]
        if first == 0:  # the step's first chunk carries the request time and the owner
            out[0] = msgspec.structs.replace(
                out[0],
                request_time_ns=self.request_time_ns,
                key_name=self.key_name,
                tenant=self.tenant,
                parent=self.parent,
                routed=self.routed,
            )
        return out


class _Version(msgspec.Struct):
    """Only the writer's version of a stored message (absent: 1, as v1 readers took it)."""

    v: int = 1


frame_decoder: msgspec.json.Decoder[ChunkFrame] = msgspec.json.Decoder(ChunkFrame)
_version_decoder = msgspec.json.Decoder(_Version)
_envelope_decoder = msgspec.json.Decoder(ChunkEnvelope)


def chunk_envelopes(payload: bytes | bytearray | memoryview) -> list[ChunkEnvelope]:
    """The chunk envelopes a stored chunk message carries, in ordinal order: one for a v1
    message (a single :class:`ChunkEnvelope`), one per chunk for a v2 :class:`ChunkFrame`.

    Every reader of the chunk stream decodes through this (assembler, telemetry, replay,
    verify, rebuild, tail, the events endpoint). Raises ``msgspec.ValidationError`` or
    ``msgspec.DecodeError`` (both ``msgspec.DecodeError``) for a payload that is neither, or
    whose version is newer than this reader's.

    >>> v1 = (b'{"session":"s","turn":0,"step":0,"ordinal":4,"time_ns":1,"provider":"p",'
    ...       b'"model":"m","chunk":{"type":"usage","usage":{}},"v":1}')
    >>> [e.ordinal for e in chunk_envelopes(v1)]
    [4]
    """
    if payload[:7] == _FRAME_PREFIX:
        return frame_decoder.decode(payload).envelopes()
    version = _version_decoder.decode(payload).v
    if version == FRAME_VERSION:
        return frame_decoder.decode(payload).envelopes()
    if version > FRAME_VERSION:
        raise msgspec.ValidationError(
            f"a chunk message of schema version {version}; this reader knows up to {FRAME_VERSION}"
        )
    return [_envelope_decoder.decode(payload)]


_item_encoder = msgspec.json.Encoder()
_PLACEHOLDER = [FramedChunk(0, Usage(TokenUsage()))]
_CHUNKS_KEY = b'"chunks":['
FRAME_TAIL = b"]}"
"""What follows the last chunk of a frame (see :func:`frame_head`)."""


def frame_head(
    *,
    session: str,
    turn: int,
    step: int,
    ordinal: int,
    time_ns: int,
    provider: str,
    model: str,
    request_time_ns: int | None = None,
    key_name: str | msgspec.UnsetType = msgspec.UNSET,
    tenant: str | msgspec.UnsetType = msgspec.UNSET,
    parent: StepLink | msgspec.UnsetType = msgspec.UNSET,
    routed: Routed | msgspec.UnsetType = msgspec.UNSET,
) -> bytes:
    """A frame's bytes up to its first chunk, for a writer that adds chunks one at a time.

    The frame is ``head + b",".join(frame_item(...) for each chunk) + FRAME_TAIL``: the same
    bytes as encoding the :class:`ChunkFrame` whole (tested), with each chunk encoded once,
    as it comes, so that the writer knows the frame's size before it adds the next.
    """
    frame = ChunkFrame(
        session=session,
        turn=turn,
        step=step,
        ordinal=ordinal,
        time_ns=time_ns,
        provider=provider,
        model=model,
        request_time_ns=request_time_ns,
        key_name=key_name,
        tenant=tenant,
        parent=parent,
        routed=routed,
        chunks=_PLACEHOLDER,
    )
    whole = _item_encoder.encode(frame)
    # ``chunks`` is the last field, after every string field (whose quotes are escaped), so
    # its key's last occurrence is the field itself.
    return whole[: whole.rindex(_CHUNKS_KEY) + len(_CHUNKS_KEY)]


def frame_item(dt_ns: int, chunk: StreamChunk) -> bytes:
    """One chunk's bytes in a frame: ``[dt_ns, chunk]``."""
    return _item_encoder.encode(FramedChunk(dt_ns, chunk))
