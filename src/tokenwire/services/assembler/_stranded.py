"""A dead holder's deliveries, delivered again now rather than after ``ack_wait``.

An instance that dies holding a partition's pin leaves its delivered, unacknowledged messages
with the server, which redelivers them only after ``ack_wait`` (300 s), and pins a partition
only when it delivers: with nothing new to deliver, the partition has no owner and the steps
those messages carry wait for that long. The member the shares allot the partition to
(``_shares.allot``: nobody live holds it) watches for that state on its lag polls: no pin,
messages unacknowledged, no delivery between two polls. Then it resets the consumer
(``broker.reset``: everything above the ack floor is delivered again at once, in stream
order) and its standby pull gets the messages with the pin. Messages acknowledged above the
floor come again too, so deliveries up to the highest one before the reset are looked up in
the store first, as redeliveries are. ADR 0045.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from tokenwire.broker import BrokerError, Connection, ConsumerState, Topology, reset
from tokenwire.services.assembler._metrics import AssemblerMetrics

log = logging.getLogger(__name__)


@dataclass
class Stranded:
    """Finds partitions whose deliveries nobody holds any more, and has them redelivered."""

    nc: Connection
    topology: Topology
    metrics: AssemblerMetrics
    _marks: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Per partition found stranded on the last poll: (deliveries made, ack floor) then."""
    _repeats_to: dict[int, int] = field(default_factory=dict)
    """Per partition reset here: the highest stream seq delivered before the reset."""

    async def check(self, partition: int, state: ConsumerState, *, standing_by: bool) -> bool:
        """Reset ``partition``'s consumer when it was found stranded on this poll and the
        last, unchanged, while this instance stands by for it; whether it did."""
        stranded = state.num_ack_pending > 0 and state.pinned(self.topology.assembler_group) is None
        if not (standing_by and stranded):
            self._marks.pop(partition, None)
            return False
        mark = (state.delivered.consumer_seq, state.ack_floor.stream_seq)
        if self._marks.get(partition) != mark:  # first seen, or deliveries moved meanwhile
            self._marks[partition] = mark
            return False
        del self._marks[partition]
        t = self.topology
        try:
            await reset(self.nc, t.stream_of_partition(partition), t.assembler_consumer(partition))
        except BrokerError as exc:  # a server before 2.14: they come back after ack_wait
            log.warning("partition %d: could not reset its consumer: %s", partition, exc)
            self.metrics.resets.labels("failed").inc()
            return False
        last = state.delivered.stream_seq
        self._repeats_to[partition] = max(self._repeats_to.get(partition, 0), last)
        log.info(
            "partition %d: %d messages delivered to a holder gone (no pin, nothing delivered "
            "since the last poll); consumer reset, delivering again from seq %d",
            partition,
            state.num_ack_pending,
            state.ack_floor.stream_seq + 1,
        )
        self.metrics.resets.labels("ok").inc()
        return True

    def repeats(self, partition: int, stream_seq: int) -> bool:
        """Whether a delivery of ``partition`` may repeat one made before a reset here (then
        its step is looked up in the store, as for a redelivery)."""
        return stream_seq <= self._repeats_to.get(partition, 0)
