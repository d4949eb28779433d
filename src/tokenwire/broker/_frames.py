"""Chunk publishes written as HPUB frames straight into nats-py's outgoing buffer.

The one place tokenwire reaches below nats-py's public API (ADR 0008, which gives the cost of
``Client.publish``'s per-message subject and header checks): the publisher's subjects are
built from validated session ids and its header names are its own, so a frame is built
directly, appended with ``Client._send_command`` and the flusher kicked, as ``publish`` does.
Only while the connection is up (reconnecting or draining take the public path). The server
counts the header block in ``max_payload``: the publisher checks :func:`header_block`'s length
before either path. If a nats-py release renames what this uses,
:attr:`FrameWriter.enabled` is false and tests/broker/test_frames.py fails.
"""

from __future__ import annotations

from collections.abc import Mapping

from nats.aio.client import Client

_PRIVATE_API = ("_send_command", "_flush_pending", "_flush_queue")
_NO_NEWLINES = str.maketrans({"\r": " ", "\n": " "})


def hpub_frame(subject: str, reply: str, headers: Mapping[str, str], payload: bytes) -> bytes:
    """One ``HPUB`` protocol frame; header values lose CR and LF (as nats-py's own do)."""
    return frame(subject, reply, header_block(headers), payload)


def header_block(headers: Mapping[str, str]) -> bytes:
    """The ``NATS/1.0`` header block of ``headers``, values without CR, LF and surrounding
    whitespace; its length is what the server counts in ``max_payload`` beside the payload.

    Built once per message by the publisher, which checks the size with it and writes it in
    the frame (issue 19: with a separate size count and the frame's own build, 3.0 us a
    message on a busy machine; this and :func:`frame` together 1.5 us: docs/benchmarks.md).
    """
    text = "NATS/1.0\r\n"
    for name, raw in headers.items():
        value = raw.translate(_NO_NEWLINES) if "\r" in raw or "\n" in raw else raw
        text += f"{name}: {value.strip()}\r\n"
    return (text + "\r\n").encode()


def pub_frame(subject: str, payload: bytes) -> bytes:
    """One ``PUB`` frame without headers or reply (a consumer's ``+ACK``)."""
    return b"PUB %s %d\r\n%s\r\n" % (subject.encode(), len(payload), payload)


def frame(subject: str, reply: str, header: bytes, payload: bytes) -> bytes:
    """One ``HPUB`` frame from a :func:`header_block` and the payload."""
    return b"HPUB %s %s %d %d\r\n%s%s\r\n" % (
        subject.encode(),
        reply.encode(),
        len(header),
        len(header) + len(payload),
        header,
        payload,
    )


_HEADER_FRAMING = len(b"NATS/1.0\r\n") + len(b"\r\n")
_PER_HEADER = len(b": ") + len(b"\r\n")


def header_size(headers: Mapping[str, str]) -> int:
    """Bytes of the header block :func:`hpub_frame` writes for ``headers`` (an upper bound:
    a value's surrounding whitespace, stripped on the wire, is counted)."""
    size = _HEADER_FRAMING
    for name, value in headers.items():
        size += len(name) + _PER_HEADER + (len(value) if value.isascii() else len(value.encode()))
    return size


def message_size(headers: Mapping[str, str], payload_size: int) -> int:
    """What the server compares with its ``max_payload``: the header block plus the payload."""
    return header_size(headers) + payload_size


class FrameWriter:
    """Writes pre-encoded frames on one connection (see the module docstring)."""

    def __init__(self, nc: Client) -> None:
        self._nc = nc
        self.enabled = all(hasattr(nc, name) for name in _PRIVATE_API)

    def usable(self, payload_size: int) -> bool:
        """Whether a message of this size may be written as a frame now."""
        nc = self._nc
        return (
            self.enabled
            and nc.is_connected
            and not nc.is_draining_pubs
            and payload_size <= nc.max_payload
        )  # the publisher checked the size with the headers counted (message_size)

    async def publish(
        self, subject: str, reply: str, headers: Mapping[str, str] | bytes, payload: bytes
    ) -> None:
        """Append the message's frame to the outgoing buffer and kick the flusher; ``headers``
        as a mapping or as its :func:`header_block` already built."""
        header = headers if isinstance(headers, bytes) else header_block(headers)
        await self.write(frame(subject, reply, header, payload), 1, len(payload))

    async def write(self, frames: bytes, messages: int, payload_bytes: int) -> None:
        """Append ready frames (:func:`frame`, :func:`pub_frame`) of ``messages`` messages
        carrying ``payload_bytes`` in all, and kick the flusher."""
        nc = self._nc
        await nc._send_command(frames)
        if nc._flush_queue is not None and nc._flush_queue.empty():
            await nc._flush_pending()
        nc.stats["out_msgs"] += messages
        nc.stats["out_bytes"] += payload_bytes
