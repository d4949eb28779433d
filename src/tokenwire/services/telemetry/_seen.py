"""Was a step's stream-started signal already published? (the redelivery check)

The events stream's duplicate window (``Topology.duplicate_window_s``, 120 s) drops a
republished signal only while the window is open. A first chunk is redelivered ``ack_wait``
after a crash between publish and ack, or whenever the consumer comes back after a longer
outage, possibly after the window closed. So a redelivered first chunk (``num_delivered > 1``)
is checked against the stored events: the session's started events are read back by subject
(``$JS.API.STREAM.MSG.GET``, newest first, then oldest up), and a stored one with the same
``Nats-Msg-Id`` means the signal is already out. Bounded: at most ``max_reads`` reads.
"""

from __future__ import annotations

import base64
from typing import Any

import msgspec
from nats.aio.client import Client

from tokenwire.broker import Topology

MAX_READS = 256
_NO_MESSAGE = 10037


class LookupFailedError(Exception):
    """The events stream did not answer (the caller retries the message later)."""


class _Stored(msgspec.Struct):
    seq: int
    hdrs: str | None = None


class _Reply(msgspec.Struct):
    message: _Stored | None = None
    error: dict[str, Any] | None = None


_reply = msgspec.json.Decoder(_Reply)


async def already_signaled(
    nc: Client,
    topology: Topology,
    session: str,
    msg_id: str,
    *,
    timeout_s: float,
    max_reads: int = MAX_READS,
) -> bool:
    """True when a started event with ``Nats-Msg-Id: msg_id`` is stored for ``session``."""
    subject = topology.event_subject(session, "started")
    api = f"$JS.API.STREAM.MSG.GET.{topology.events_stream}"
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
    try:
        reply = _reply.decode((await nc.request(api, msgspec.json.encode(body), timeout_s)).data)
    except Exception as exc:
        raise LookupFailedError(f"{api}: {type(exc).__name__}") from exc
    if reply.error is not None:
        if reply.error.get("err_code") == _NO_MESSAGE:
            return None
        raise LookupFailedError(f"{api}: {reply.error.get('description')}")
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
