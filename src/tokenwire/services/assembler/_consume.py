"""The partition consumers, with acknowledgements deferred until the store committed.

``tokenwire.broker.PullConsumer`` acknowledges a message when its handler returns. The
assembler must not: a chunk is acknowledged only after the step it belongs to was committed,
which is usually many messages later. :class:`HeldConsumer` is a PullConsumer whose handler
owns the settlement of every message it takes (ack, term, nak); when the handler raises, the
message is naked for redelivery. Everything else (pull loop, pinning, flow control, stop) is
the broker package's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import msgspec
from nats.aio.client import Client
from nats.errors import Error as NatsError

from tokenwire.broker import ConsumedMessage, Handler, PullConsumer, PullSettings, Topology

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
        return self.message is None or await _settle(self.message.ack())

    async def term(self) -> bool:
        """Terminate (never redeliver): for a message already dead-lettered."""
        return self.message is None or await _settle(self.message.term())

    async def nak(self) -> bool:
        """Hand the message back for immediate redelivery (to this or another instance)."""
        return self.message is None or await _settle(self.message.nak())


async def _settle(verb: Awaitable[None]) -> bool:
    try:
        await verb
    except NatsError:
        log.warning("could not settle a message; it will be redelivered after ack_wait")
        return False
    return True


class HeldConsumer(PullConsumer):
    """A PullConsumer whose handler settles (or keeps) each message itself."""

    async def _dispatch(self, cm: ConsumedMessage) -> None:
        try:
            await self.handler(cm)
        except Exception:
            log.exception("assembler handler failed on %s; naking for redelivery", self.consumer)
            with contextlib.suppress(NatsError):
                await cm.nak(self.settings.retry_backoff_s)
        else:
            self.stats.handled += 1


@dataclass
class PartitionSet:
    """One :class:`HeldConsumer` per partition; the server pins each to one instance."""

    nc: Client
    topology: Topology
    handler_for: Callable[[int], Handler]
    settings: PullSettings
    consumers: dict[int, HeldConsumer] = field(default_factory=dict)
    _pinned: list[int] = field(default_factory=list)

    async def start(self) -> None:
        t = self.topology
        for p in range(t.partitions):
            consumer = HeldConsumer(
                self.nc,
                t.stream,
                t.assembler_consumer(p),
                self.handler_for(p),
                group=t.assembler_group,
                settings=self.settings,
            )
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
            subject = f"$JS.API.CONSUMER.UNPIN.{t.stream}.{t.assembler_consumer(p)}"
            body = msgspec.json.encode({"group": t.assembler_group})
            with contextlib.suppress(NatsError, TimeoutError):
                await self.nc.request(subject, body, timeout=2.0)
        self._pinned = []

    def owned(self) -> list[int]:
        """Partitions this instance holds the pin of."""
        return sorted(p for p, c in self.consumers.items() if c.pin_id is not None)

    def buffered(self) -> int:
        """Delivered messages not yet handed to the handler."""
        return sum(c.buffered for c in self.consumers.values())
