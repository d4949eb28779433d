"""Single messages outside the chunk path: events, acknowledged writes, reads by subject.

- :func:`publish_event`: a core publish, deduplicated by ``Nats-Msg-Id`` when it has one
  (a stream may store it; nobody waits for an ack): the telemetry's live signals. (The
  assembler's ``persisted`` events go through ``EventPublisher``: acked, retried.)
- :func:`publish_acked`: a JetStream publish that returns once the stream stored it (KV
  heartbeats, the telemetry signal); says whether the stream dropped it as a duplicate.
- :func:`last_by_subject`: the newest message stored on a subject (``DIRECT.GET``).
- :func:`stored_with_msg_id`: is a message with a given ``Nats-Msg-Id`` stored on a subject?
  (``STREAM.MSG.GET`` newest first, then oldest up; at most ``max_reads`` reads.)
- :func:`next_stored`: the first message on a subject (wildcards allowed) after a sequence or
  at or after a time (``STREAM.MSG.GET`` with ``next_by_subj``: one request, answered from the
  server's per-subject index, however long the stream).

Each raises :class:`~tokenwire.broker.RequestFailed` (or ``BrokerUnavailable``) when the
server did not take or answer it.
"""

from __future__ import annotations

import base64
import datetime
from typing import Any

import msgspec
from nats.aio.client import Client

from tokenwire.broker._errors import RequestFailed
from tokenwire.broker._puback import puback_decoder
from tokenwire.broker._translate import translated

MAX_READS = 256
_NO_MESSAGE = 10037


async def publish_event(
    nc: Client, subject: str, payload: bytes, *, msg_id: str | None = None
) -> None:
    """Core publish, with ``Nats-Msg-Id: msg_id`` when given (buffered; no round trip)."""
    headers = {"Nats-Msg-Id": msg_id} if msg_id is not None else None
    with translated(nc, f"publish to {subject}"):
        await nc.publish(subject, payload, headers=headers)


async def publish_acked(
    nc: Client,
    subject: str,
    payload: bytes,
    *,
    headers: dict[str, str] | None = None,
    timeout_s: float = 2.0,
) -> bool:
    """Publish and wait for the stream's ack; True when it was a duplicate (not stored again).

    A request with the muxed inbox and the PubAck decoded by msgspec: nats-py's
    ``JetStreamContext.publish`` builds a context per call and decodes with ``json`` into a
    dataclass, about twice the CPU per publish (the telemetry consumer publishes one per step).
    """
    what = f"publish to {subject}"
    with translated(nc, what):
        reply = await nc.request(subject, payload, timeout_s, headers=headers)
        ack = puback_decoder.decode(reply.data)
    if ack.error is not None:
        raise RequestFailed(what, ack.error.description, ack.error.err_code)
    return ack.duplicate


class StoredMessage(msgspec.Struct, frozen=True):
    """A stored message read by subject: its payload and headers."""

    data: bytes
    headers: dict[str, str]


async def last_by_subject(
    nc: Client, stream: str, subject: str, timeout_s: float = 2.0
) -> StoredMessage | None:
    """The newest message ``stream`` stores on ``subject``, None when there is none."""
    body = msgspec.json.encode({"last_by_subj": subject})
    with translated(nc, f"last message on {subject}"):
        reply = await nc.request(f"$JS.API.DIRECT.GET.{stream}", body, timeout=timeout_s)
    headers = reply.headers or {}
    status = headers.get("Status")
    if status == "404":
        return None
    if status is not None:
        raise RequestFailed(f"last message on {subject}", f"{status} {headers.get('Description')}")
    return StoredMessage(reply.data, headers)


class _Stored(msgspec.Struct):
    seq: int
    hdrs: str | None = None
    data: str | None = None
    time: datetime.datetime | None = None


class _Reply(msgspec.Struct):
    message: _Stored | None = None
    error: dict[str, Any] | None = None


_reply = msgspec.json.Decoder(_Reply)


async def stored_with_msg_id(
    nc: Client,
    stream: str,
    subject: str,
    msg_id: str,
    *,
    timeout_s: float = 2.0,
    max_reads: int = MAX_READS,
) -> bool:
    """True when ``stream`` stores a message on ``subject`` with ``Nats-Msg-Id: msg_id``
    (within the newest one and the ``max_reads - 1`` oldest)."""
    api = f"$JS.API.STREAM.MSG.GET.{stream}"
    newest = await _get(nc, api, {"last_by_subj": subject}, timeout_s)
    if newest is None:
        return False
    if _has_id(newest, msg_id):
        return True
    seq = 1
    for _ in range(max_reads - 1):
        stored = await _get(nc, api, {"seq": seq, "next_by_subj": subject}, timeout_s)
        if stored is None or stored.seq >= newest.seq:
            return False
        if _has_id(stored, msg_id):
            return True
        seq = stored.seq + 1
    return False


async def _get(nc: Client, api: str, body: dict[str, Any], timeout_s: float) -> _Stored | None:
    with translated(nc, api):
        reply = _reply.decode((await nc.request(api, msgspec.json.encode(body), timeout_s)).data)
    if reply.error is not None:
        if reply.error.get("err_code") == _NO_MESSAGE:
            return None
        raise RequestFailed(api, str(reply.error.get("description")), reply.error.get("err_code"))
    return reply.message


def _has_id(stored: _Stored, msg_id: str) -> bool:
    if stored.hdrs is None:
        return False
    headers = base64.b64decode(stored.hdrs).decode("utf-8", "replace")
    return any(
        line.partition(":")[0].strip().lower() == "nats-msg-id"
        and line.partition(":")[2].strip() == msg_id
        for line in headers.split("\r\n")
    )


class StoredAt(msgspec.Struct, frozen=True):
    """A stored message read by position: its stream sequence and payload (and, from
    :func:`last_stored`, its headers and the broker's time of it, Unix ns)."""

    seq: int
    data: bytes
    headers: dict[str, str] = msgspec.field(default_factory=dict)
    time_ns: int = 0


async def last_stored(
    nc: Client, stream: str, subject: str, *, timeout_s: float = 2.0
) -> StoredAt | None:
    """The newest message of ``stream`` on ``subject``, asked of the stream's leader (one
    ``STREAM.MSG.GET``, not a direct get that any replica may answer); None when there is
    none."""
    api = f"$JS.API.STREAM.MSG.GET.{stream}"
    stored = await _get(nc, api, {"last_by_subj": subject}, timeout_s)
    if stored is None:
        return None
    moment = stored.time
    return StoredAt(
        stored.seq,
        base64.b64decode(stored.data or ""),
        _header_fields(stored.hdrs),
        int(moment.timestamp() * 1e9) if moment is not None else 0,
    )


def _header_fields(hdrs: str | None) -> dict[str, str]:
    """The headers of a stored message (``NATS/1.0`` and ``Name: value`` lines, base64)."""
    if not hdrs:
        return {}
    lines = base64.b64decode(hdrs).decode("utf-8", "replace").split("\r\n")[1:]
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines) if k}


async def next_stored(
    nc: Client,
    stream: str,
    subject: str,
    *,
    after_seq: int | None = None,
    since_ns: int | None = None,
    timeout_s: float = 2.0,
) -> StoredAt | None:
    """The first message of ``stream`` on ``subject`` (wildcards allowed) with a sequence
    above ``after_seq``, or (``since_ns``) stored at or after that Unix time; None when there
    is none (yet)."""
    body: dict[str, Any] = {"next_by_subj": subject}
    if since_ns is not None:
        moment = datetime.datetime.fromtimestamp(since_ns / 1e9, tz=datetime.UTC)
        body["start_time"] = moment.isoformat().replace("+00:00", "Z")
    else:
        body["seq"] = (after_seq or 0) + 1
    stored = await _get(nc, f"$JS.API.STREAM.MSG.GET.{stream}", body, timeout_s)
    if stored is None:
        return None
    return StoredAt(stored.seq, base64.b64decode(stored.data or ""))
