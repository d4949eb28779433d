"""Dead-lettering: one writer, one header set, for every consumer.

A message that can never succeed is copied to ``<prefix>.dlq.<consumer>`` (the DLQ stream
acknowledges it) and only then terminated. The copy carries:

- ``Nats-Msg-Id: dlq:<stream>:<seq>``: a second copy of the same message (its redelivery
  after a failed term) is dropped by the DLQ stream's duplicate window;
- ``Tokenwire-Reason`` (a short code) and ``Tokenwire-Detail`` (the explanation, at most
  512 characters);
- ``Tokenwire-Subject``, ``Tokenwire-Stream``, ``Tokenwire-Stream-Seq``: where it came from.

If the copy is not acknowledged, the message is left unsettled: the server redelivers it after
``ack_wait`` and it is dead-lettered then. Never terminated without its copy.
"""

from __future__ import annotations

import logging

from nats.aio.client import Client
from nats.errors import Error as NatsError

from tokenwire.broker._consumed import ConsumedMessage
from tokenwire.broker._errors import BrokerError
from tokenwire.broker._translate import translated

log = logging.getLogger(__name__)

MAX_DETAIL = 512


def dead_letter_headers(
    cm: ConsumedMessage, stream: str, reason: str, detail: str = ""
) -> dict[str, str]:
    """The header set of a dead-lettered copy of ``cm`` (see module)."""
    seq = seq_of(cm)
    return {
        "Nats-Msg-Id": f"dlq:{stream}:{seq}",
        "Tokenwire-Reason": reason[:MAX_DETAIL],
        "Tokenwire-Detail": (detail or reason)[:MAX_DETAIL],
        "Tokenwire-Subject": cm.subject,
        "Tokenwire-Stream": stream,
        "Tokenwire-Stream-Seq": str(seq),
    }


async def dead_letter(
    nc: Client,
    dlq_subject: str,
    cm: ConsumedMessage,
    *,
    stream: str,
    reason: str,
    detail: str = "",
    timeout_s: float = 2.0,
    terminate: bool = True,
) -> bool:
    """Copy ``cm`` to ``dlq_subject``, then terminate it; False (and ``cm`` left unsettled)
    when the copy was not acknowledged or the term could not be sent. ``terminate=False``
    only copies it: a frame whose other chunks are good is settled with their step."""
    headers = dead_letter_headers(cm, stream, reason, detail)
    try:
        with translated(nc, f"dead-letter to {dlq_subject}"):
            await nc.jetstream().publish(dlq_subject, cm.data, headers=headers, timeout=timeout_s)
        if terminate:
            await cm.term()
    except BrokerError as exc:
        log.warning(
            "could not dead-letter seq %s (%s), left unsettled: %s",
            headers["Tokenwire-Stream-Seq"],
            reason,
            exc,
        )
        return False
    return True


def seq_of(cm: ConsumedMessage) -> int:
    """``cm``'s stream sequence, -1 when its reply subject is not a JetStream ack subject."""
    try:
        return cm.stream_seq
    except (NatsError, ValueError, IndexError):
        return -1
