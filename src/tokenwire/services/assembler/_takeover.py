"""Reading back what a previous owner of a partition held when this instance takes it over.

When the server pins a partition to this instance, the previous owner may have died holding
delivered, unacknowledged messages. JetStream redelivers those only after ``ack_wait``, while
new messages arrive at once: a session's later step could then close (and commit) before the
redelivered chunks of its earlier step, which a clean run never does. So before handling the
first message it gets, the new owner reads the partition from the consumer's ack floor up to
the highest message delivered to anyone, straight from the stream, and feeds that first.
Those copies carry no ack handle; the redeliveries that follow are recognised as chunks of
known steps and acknowledged. Skipped only when nothing delivered is unsettled, or when the
first message is a fresh one right above the ack floor. It is not skipped when every unsettled
message is on its way to this instance: redeliveries arrive in the order the server queued
them (the predecessor's naks, then its expired deliveries), not in stream order.

The same read-back covers deliveries lost on the way to this instance while it keeps its pin
(a broker node that died with them in its buffers): the server counts them delivered and
redelivers them only after ``ack_wait``. A jump in the consumer sequence under one pin reveals
them before the next message; when nothing follows, the consumer's delivered count standing
above the last arrival for two lag polls does (``Assembler._check_tail``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Literal, TypeAlias

import msgspec
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js import api

from tokenwire.broker import ordered_subscribe
from tokenwire.services.assembler._errors import ReadBackError

log = logging.getLogger(__name__)

ReadBackCause: TypeAlias = Literal["pin", "lost", "tail"]
"""Why a partition is read back: newly pinned here, a jump in the consumer sequence under
our pin, or the server's delivered count above the last arrival with nothing following."""


class _Floor(msgspec.Struct):
    stream_seq: int = 0
    consumer_seq: int = 0


class _Group(msgspec.Struct):
    group: str = ""
    pinned_client_id: str = ""


class ConsumerState(msgspec.Struct):
    """The fields of ``$JS.API.CONSUMER.INFO`` the assembler reads.

    ``ack_floor.stream_seq``: every message at or below it is settled; ``delivered.stream_seq``:
    the highest message delivered to any client of the consumer (``consumer_seq``: how many
    deliveries it made); ``priority_groups``: who holds each group's pin.
    """

    num_pending: int = 0
    num_ack_pending: int = 0
    ack_floor: _Floor = msgspec.field(default_factory=_Floor)
    delivered: _Floor = msgspec.field(default_factory=_Floor)
    priority_groups: list[_Group] = msgspec.field(default_factory=list)

    def pinned(self, group: str) -> str | None:
        """The id of the client holding ``group``'s pin (None: no one)."""
        pins = [g.pinned_client_id for g in self.priority_groups if g.group == group]
        return pins[0] or None if pins else None


_state_decoder = msgspec.json.Decoder(ConsumerState)


async def consumer_state(
    nc: Client, stream: str, consumer: str, timeout_s: float = 2.0
) -> ConsumerState | None:
    """The consumer's pending counts and ack floor, or None when the server did not answer."""
    subject = f"$JS.API.CONSUMER.INFO.{stream}.{consumer}"
    try:
        reply = await nc.request(subject, b"", timeout=timeout_s)
        return _state_decoder.decode(reply.data)
    except (NatsError, TimeoutError, msgspec.DecodeError) as exc:
        log.warning("consumer info of %s/%s failed: %s", stream, consumer, exc)
        return None


async def read_range(
    nc: Client, stream: str, subject: str, first: int, *, last: int, idle_s: float = 2.0
) -> AsyncIterator[tuple[int, bytes]]:
    """``(stream_seq, payload)`` of the messages on ``subject`` with ``first <= seq <= last``.

    An ordered consumer from ``first``; stops at ``last`` or at the end of the stream.
    Raises ReadBackError after ``idle_s`` without a message (bounded: a slow or failing
    stream ends the read with an error, never silently short, and it never hangs).
    """
    js = nc.jetstream()
    config = api.ConsumerConfig(
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=first
    )
    sub = await ordered_subscribe(js, subject, stream=stream, config=config)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=idle_s)
            except TimeoutError:
                raise ReadBackError(f"no message within {idle_s} s before seq {last}") from None
            seq = msg.metadata.sequence.stream
            if seq > last:
                return
            yield seq, msg.data
            if seq >= last or msg.metadata.num_pending == 0:
                return
    finally:
        with contextlib.suppress(NatsError):
            await sub.unsubscribe()
