"""The assembler side: one pinned-client pull consumer per partition, run by one object."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from nats.aio.client import Client

from tokenwire.broker._consumer import (
    BatchHandler,
    ConsumerStats,
    Handler,
    PullConsumer,
    PullSettings,
)
from tokenwire.broker._topology import Topology


def partition_consumer(
    nc: Client,
    topology: Topology,
    partition: int,
    handler: Handler | None = None,
    settings: PullSettings | None = None,
    *,
    batch_handler: BatchHandler | None = None,
    dlq_subject: str | None = None,
) -> PullConsumer:
    """The consumer ``assembler-p<partition>`` in the assemblers priority group (not started).

    Exactly one of ``handler`` and ``batch_handler`` (see PullConsumer). Rejected messages go
    to ``dlq_subject``, by default ``<prefix>.dlq.assembler-p<partition>``.
    """
    name = topology.assembler_consumer(partition)
    return PullConsumer(
        nc,
        topology.stream,
        name,
        handler,
        group=topology.assembler_group,
        settings=settings or PullSettings(),
        dlq_subject=dlq_subject or topology.dlq_subject(name),
        batch_handler=batch_handler,
    )


@dataclass
class AssemblerConsumers:
    """All partitions for one assembler instance; the server decides which it owns.

    Every instance pulls every partition; per partition the server pins one instance and the
    others stand by, taking over within the priority timeout when the owner goes away.
    ``handler`` is called one message at a time per partition (``batch_handler``: with every
    message delivered since its last call), in delivery order; partitions run concurrently.
    """

    nc: Client
    topology: Topology
    handler: Handler | None = None
    settings: PullSettings = field(default_factory=PullSettings)
    batch_handler: BatchHandler | None = None
    consumers: dict[int, PullConsumer] = field(default_factory=dict, init=False)

    async def start(self) -> AssemblerConsumers:
        for p in range(self.topology.partitions):
            consumer = partition_consumer(
                self.nc, self.topology, p, self.handler, self.settings,
                batch_handler=self.batch_handler,
            )  # fmt: skip
            self.consumers[p] = await consumer.start()
        return self

    async def stop(self, timeout_s: float = 5.0, release: bool = True) -> None:
        """Stop every partition (see PullConsumer.stop); standbys take over released ones."""
        await asyncio.gather(*(c.stop(timeout_s, release) for c in self.consumers.values()))
        self.consumers.clear()

    def active_partitions(self) -> list[int]:
        """Partitions this instance holds the pin of (learned from delivered messages)."""
        return sorted(p for p, c in self.consumers.items() if c.pinned)

    def stats(self) -> dict[int, ConsumerStats]:
        return {p: c.stats for p, c in self.consumers.items()}
