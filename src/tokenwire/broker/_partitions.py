"""The consumer of one partition: ``assembler-p<i>`` in the assemblers' priority group."""

from __future__ import annotations

from nats.aio.client import Client

from tokenwire.broker._consumer import (
    BatchHandler,
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
    """The consumer ``assembler-p<partition>`` in the assemblers priority group (not started),
    on the stream of the partition's shard.

    Exactly one of ``handler`` and ``batch_handler`` (see PullConsumer). Rejected messages go
    to ``dlq_subject``, by default ``<prefix>.dlq.assembler-p<partition>``.
    """
    name = topology.assembler_consumer(partition)
    return PullConsumer(
        nc,
        topology.stream_of_partition(partition),
        name,
        handler,
        group=topology.assembler_group,
        settings=settings or PullSettings(),
        dlq_subject=dlq_subject or topology.dlq_subject(name),
        batch_handler=batch_handler,
    )
