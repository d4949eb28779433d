"""One delivered JetStream message (:class:`ConsumedMessage`): its payload, headers,
sequence numbers and ack verbs, read from the ack subject without nats-py's ``Msg``
(docs/broker.md, "Consuming")."""

from __future__ import annotations

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import NotJSMessageError

from tokenwire.broker._api import NS, server_url
from tokenwire.broker._errors import BrokerUnavailable
from tokenwire.broker._replies import header_fields


class ConsumedMessage:
    """One delivered JetStream message: payload, headers, sequence and the ack verbs.

    The verbs write one protocol message into the connection's outgoing buffer (no round
    trip). The first of ``ack``, ``nak`` and ``term`` settles the message; later ones are
    ignored (``in_progress`` may be sent any number of times before that). A verb that
    cannot be sent (connection closed) raises :class:`BrokerUnavailable`; the server then
    redelivers after ``ack_wait``.
    """

    __slots__ = (
        "_header_block",
        "_headers",
        "_meta",
        "_nc",
        "_reply",
        "_settled",
        "data",
        "pin_id",
        "subject",
    )

    def __init__(
        self,
        subject: str,
        reply: str,
        data: bytes,
        headers: bytes | None,
        pin_id: str | None,
        nc: Client,
    ) -> None:
        # One object per message, its header block kept as bytes until read: an owner holding
        # many messages until a commit keeps one GC-tracked object per message (see services/
        # assembler/_gc.py for why held objects are the assembler's main GC cost).
        self.subject = subject
        self.data = data
        self.pin_id = pin_id
        self._header_block: bytes | None = headers
        self._headers: dict[str, str] | None = None
        self._reply = reply
        self._nc = nc
        self._meta: tuple[int, int, int] | None = None
        self._settled = False

    @classmethod
    def of(cls, msg: Msg, pin_id: str | None, nc: Client) -> ConsumedMessage:
        """From nats-py's ``Msg`` (its headers already parsed)."""
        cm = cls(msg.subject, msg.reply, msg.data, None, pin_id, nc)
        cm._headers = msg.headers or {}
        return cm

    @property
    def headers(self) -> dict[str, str]:
        """The message's headers, parsed from its header block on first use."""
        if self._headers is None:
            self._headers = header_fields(self._header_block)
            self._header_block = None
        return self._headers

    @property
    def stream_seq(self) -> int:
        return self._fields()[0]

    @property
    def num_delivered(self) -> int:
        return self._fields()[1]

    @property
    def consumer_seq(self) -> int:
        """This delivery's consumer sequence (counts deliveries of this consumer: a pinned
        client receives every one of them, so a jump means deliveries lost on the way)."""
        return self._fields()[2]

    def _fields(self) -> tuple[int, int, int]:
        if self._meta is None:
            self._meta = _ack_meta(self._reply)
        return self._meta

    @property
    def resolved(self) -> bool:
        """True once acked, naked or terminated."""
        return self._settled

    async def ack(self) -> None:
        await self._send(ACK)

    async def nak(self, delay_s: float | None = None) -> None:
        await self._send(nak_payload(delay_s))

    async def term(self) -> None:
        await self._send(TERM)

    async def in_progress(self) -> None:
        """Reset the ack timer for long work; may be sent many times."""
        if not self._settled:
            await self._publish(PROGRESS)

    async def _send(self, payload: bytes) -> None:
        if not self._settled:
            await self._publish(payload)
            self._settled = True

    async def _publish(self, payload: bytes) -> None:
        try:
            await self._nc.publish(self._reply, payload)
        except NatsError as exc:  # closed, or the reconnect buffer full
            raise BrokerUnavailable(server_url(self._nc), type(exc).__name__) from exc


ACK, TERM, PROGRESS = b"+ACK", b"+TERM", b"+WPI"


def nak_payload(delay_s: float | None) -> bytes:
    if not delay_s:
        return b"-NAK"
    return b"-NAK " + msgspec.json.encode({"delay": int(delay_s * NS)})


def ack_fields(reply: str) -> tuple[int, int]:
    """``(stream_seq, num_delivered)`` from a JetStream ack subject.

    ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`` or, with a
    domain and account hash, ``$JS.ACK.<domain>.<hash>.<stream>...`` (11 or 12 tokens). Parsed
    here because nats-py's ``Msg.metadata`` builds a datetime and two dataclasses per message
    (~7% of the assembler's time, bench/bench_assembler.py). Raises NotJSMessageError.
    """
    return _ack_meta(reply)[:2]


def _ack_meta(reply: str) -> tuple[int, int, int]:
    """``(stream_seq, num_delivered, consumer_seq)``, in one split (see ack_fields)."""
    tokens = reply.split(".")
    if tokens[:2] == ["$JS", "ACK"]:
        if len(tokens) == 9:
            return int(tokens[5]), int(tokens[4]), int(tokens[6])
        if len(tokens) >= 11:
            return int(tokens[7]), int(tokens[6]), int(tokens[8])
    raise NotJSMessageError
