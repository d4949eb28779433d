"""Reading back what a previous owner of a partition held when this instance takes it over.

A previous owner may have died holding delivered, unacknowledged messages, which JetStream
redelivers only after ``ack_wait`` while new ones arrive at once. So before handling the first
message it gets, the new owner reads the partition from the consumer's ack floor up to the
highest message delivered to anyone, straight from the stream, and feeds that first (in
stream order); the redeliveries that follow are acknowledged as chunks of known steps. The
same read-back covers deliveries lost on the way while the pin is kept (a jump in the
consumer sequence, or ``Assembler._check_tail``), and :func:`read_back` reaches the message
that revealed the loss. When it is skipped and why: docs/assembler.md, "Ack rules".
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Literal, TypeAlias

from tokenwire.broker import (
    BrokerError,
    Connection,
    ConsumerState,
    Topology,
    consumer_state,
    read_range,
)
from tokenwire.services.assembler._errors import ReadBackError

log = logging.getLogger(__name__)

ReadBackCause: TypeAlias = Literal["pin", "lost", "tail"]
"""Why a partition is read back: newly pinned here, a jump in the consumer sequence under
our pin, or the server's delivered count above the last arrival with nothing following."""


async def partition_state(
    nc: Connection, topology: Topology, partition: int
) -> ConsumerState | None:
    """The partition consumer's state, or None when the server did not answer (logged)."""
    try:
        stream = topology.stream_of_partition(partition)
        return await consumer_state(nc, stream, topology.assembler_consumer(partition))
    except BrokerError as exc:
        log.warning("partition %d: %s", partition, exc)
        return None


async def read_back(
    nc: Connection, topology: Topology, partition: int, start: int, last: int, reach: int
) -> AsyncIterator[tuple[int, bytes]]:
    """``(stream_seq, payload)`` of the partition's messages ``start..last`` read from the
    stream; ReadBackError when the read failed, stalled, or ended before ``reach`` (never
    silently short).

    ``reach`` is the stream sequence of a message of this partition known to be stored (the
    delivery that revealed the loss); the read goes on to it. An ordered read ends where its
    consumer's pending count says the partition ends, and that consumer lives on one replica,
    any of them: one still catching up (a node just restarted) ends the read at the last
    message it holds, without an error. Every replica stores messages in sequence order, so
    a read that got to ``reach`` holds everything below it; one that did not is such a short
    read and fails, to be tried again (on a replica that caught up meanwhile).
    """
    subject = topology.partition_filter(partition)
    to = max(last, reach)
    highest = start - 1
    try:
        stream = topology.stream_of_partition(partition)
        async for seq, data in read_range(nc, stream, subject, start, last=to):
            highest = seq
            if seq <= last:
                yield seq, data
    except BrokerError as exc:
        raise ReadBackError(f"reading seqs {start}..{to}: {exc}") from exc
    if highest < reach:
        raise ReadBackError(
            f"reading seqs {start}..{to}: the read ended at seq {highest}, before seq {reach}"
            " (its replica is still catching up)"
        )
