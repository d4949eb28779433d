"""The partition consumers in manual-ack batch mode, and the assembler's ack token.

The assembler acknowledges a chunk only after the step it belongs to was committed, usually
many messages later, so its consumers run with ``PullSettings(auto_ack=False)`` (the broker
never acks for it) and a batch handler (every message delivered since the last call, no
per-message task or coroutine hop in the consumer). The handler keeps each message as a
:class:`Delivery` token inside the Assembly or the Committer, which settle it later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tokenwire.broker import (
    BatchHandler,
    BrokerError,
    Connection,
    ConsumedMessage,
    PullConsumer,
    PullSettings,
    Topology,
    ack_many,
    nak_many,
    partition_consumer,
    unpin,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Delivery:
    """The assembler's acknowledgement token: one delivered message, equal by stream sequence.

    Two deliveries of the same stream message compare equal, so an :class:`Assembly` keeps one
    token per message however often it was redelivered (the latest delivery wins).
    """

    seq: int
    message: ConsumedMessage | None = field(compare=False)
    """None for a copy read back from the stream (see _takeover): settling it does nothing."""
    partition: int = field(default=-1, compare=False)

    async def ack(self) -> bool:
        """Acknowledge; False when the connection refused it (the server will redeliver)."""
        return await ack_tokens([self]) == 0

    async def term(self) -> bool:
        """Terminate (never redeliver): for a message already dead-lettered."""
        if self.message is None:
            return True
        try:
            await self.message.term()
        except BrokerError:
            log.warning("could not terminate seq %d; it will be redelivered", self.seq)
            return False
        return True

    async def nak(self) -> bool:
        """Hand the message back for immediate redelivery (to this or another instance)."""
        return await nak_tokens([self]) == 0


async def ack_tokens(tokens: Iterable[Delivery]) -> int:
    """Acknowledge the messages of ``tokens`` (read-back copies have none); returns how many
    could not be sent. One buffered ``+ACK`` each, no round trip (broker.ack_many)."""
    return await ack_many([t.message for t in tokens if t.message is not None])


async def nak_tokens(tokens: Iterable[Delivery]) -> int:
    """Hand the messages of ``tokens`` back for immediate redelivery, in stream order; see
    :func:`ack_tokens`.

    The server redelivers naked messages first come, first served (its redelivery queue is
    FIFO), so the order of the naks is the order the next owner receives them in. Handed
    back by last activity instead, a session's later step could reach the next owner, and
    complete there, before the earlier step's chunks: committed out of order.
    """
    in_order = sorted(tokens, key=lambda t: t.seq)
    return await nak_many([t.message for t in in_order if t.message is not None])


@dataclass
class PartitionSet:
    """One manual-ack batch consumer per partition; the server pins each to one instance."""

    nc: Connection
    topology: Topology
    handler_for: Callable[[int], BatchHandler]
    settings: PullSettings
    consumers: dict[int, PullConsumer] = field(default_factory=dict)
    _pinned: list[int] = field(default_factory=list)

    async def start(self, offering: bool = True) -> None:
        """Start every partition's consumer; ``offering``: stand by at once (see
        PullConsumer.offering; the membership loop sets it per partition later)."""
        for p in range(self.topology.partitions):
            consumer = partition_consumer(
                self.nc, self.topology, p, settings=self.settings, batch_handler=self.handler_for(p)
            )
            consumer.offering = offering
            await consumer.start()
            self.consumers[p] = consumer

    async def stop(self, release: bool = True) -> None:
        """Stop every partition at once (see PullConsumer.stop)."""
        pinned = [p for p, c in self.consumers.items() if c.pin_id is not None]
        await asyncio.gather(*(c.stop(release=release) for c in self.consumers.values()))
        self._pinned = [] if release else pinned

    async def unpin(self) -> None:
        """Release the pins held at :meth:`stop`, so standbys take over now, not after the
        priority timeout (``$JS.API.CONSUMER.UNPIN``)."""
        t = self.topology
        for p in self._pinned:
            with contextlib.suppress(BrokerError):  # the server moves it after the timeout
                stream = t.stream_of_partition(p)
                await unpin(self.nc, stream, t.assembler_consumer(p), t.assembler_group)
        self._pinned = []

    def owned(self) -> list[int]:
        """Partitions this instance holds the pin of."""
        return sorted(p for p, c in self.consumers.items() if c.pin_id is not None)

    def pins(self) -> dict[int, str]:
        """Partition -> the pin id this instance holds on it."""
        return {p: c.pin_id for p, c in sorted(self.consumers.items()) if c.pin_id is not None}

    def healthy(self) -> bool:
        """Every partition's pull loop is running (a dead one must not keep a heartbeat)."""
        return all(c.running for c in self.consumers.values())

    def buffered(self) -> int:
        """Delivered messages not yet taken by the handler."""
        return sum(c.buffered for c in self.consumers.values())
