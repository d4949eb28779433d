"""JetStream's publish acknowledgement, decoded once for the publisher and the KV writer."""

from __future__ import annotations

import msgspec


class ApiError(msgspec.Struct):
    """The ``error`` of a refused publish (``err_code`` is JetStream's own, e.g. 10071)."""

    code: int = 0
    err_code: int = 0
    description: str = ""


class PubAck(msgspec.Struct):
    """``{"stream", "seq", "duplicate"}`` or ``{"error": {...}}``."""

    stream: str = ""
    seq: int = 0
    duplicate: bool = False
    error: ApiError | None = None


puback_decoder = msgspec.json.Decoder(PubAck)
