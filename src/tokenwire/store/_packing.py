"""Packing a step's chunk log into one blob, and the outcome into JSON.

A step's envelopes are stored as ONE value: the JSON array of the wire envelopes (the same
encoding as on the broker), zlib-compressed at level 1, chosen by measurement against other
levels and msgpack: docs/store.md, "Packing".
"""

from __future__ import annotations

import zlib

import msgspec

from tokenwire.schemas import ChunkEnvelope, Message, RecordedError, json_encoder
from tokenwire.store._errors import StoreIntegrityError

PACKING_ZLIB_JSON = 1
"""The ``packing`` column value of :func:`pack_chunks` blobs (room for another format later)."""

_ZLIB_LEVEL = 1
_chunks_decoder = msgspec.json.Decoder(list[ChunkEnvelope])
_message_decoder = msgspec.json.Decoder(Message)
_error_decoder = msgspec.json.Decoder(RecordedError)


def pack_chunks(chunks: list[ChunkEnvelope]) -> bytes:
    """Encode a step's envelopes as one blob (``zlib(JSON array)``)."""
    return zlib.compress(json_encoder.encode(chunks), _ZLIB_LEVEL)


def unpack_chunks(blob: bytes, packing: int = PACKING_ZLIB_JSON) -> list[ChunkEnvelope]:
    """Decode a blob made by :func:`pack_chunks`; a damaged blob is a StoreIntegrityError."""
    if packing != PACKING_ZLIB_JSON:
        raise StoreIntegrityError(f"unknown chunk packing {packing}")
    try:
        return _chunks_decoder.decode(zlib.decompress(blob))
    except (zlib.error, msgspec.DecodeError) as exc:
        raise StoreIntegrityError(f"damaged chunk log: {exc}") from exc


def encode_outcome(outcome: Message | RecordedError) -> str:
    """The outcome as JSON text (stored in a JSON/TEXT column, editable with plain SQL)."""
    return json_encoder.encode(outcome).decode()


def decode_outcome(kind: str, text: str) -> Message | RecordedError:
    """Decode an outcome column by its kind; damage is a StoreIntegrityError."""
    try:
        if kind == "message":
            return _message_decoder.decode(text)
        if kind == "error":
            return _error_decoder.decode(text)
    except msgspec.DecodeError as exc:
        raise StoreIntegrityError(f"damaged {kind} outcome: {exc}") from exc
    raise StoreIntegrityError(f"unknown outcome kind {kind!r}")
