"""The lag poll: each partition consumer's state, every ``lag_poll_s``.

It sets the lag gauges (messages undelivered and unacknowledged, seconds undelivered messages
waited without a delivery) and keeps what the readiness needs (``_ready.py``): which
partitions have messages waiting, who holds each pin, when every partition last answered,
and the consumers the broker said are missing. A missing one is handed to ``restore`` (the
service's bounded, logged re-create: ``broker.Restorer``), and stays listed until a later
poll finds it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from tokenwire.broker import (
    BrokerError,
    Connection,
    ConsumerState,
    Topology,
    consumer_state,
    missing,
)
from tokenwire.services.assembler._metrics import AssemblerMetrics

log = logging.getLogger(__name__)

Restore = Callable[[int, BrokerError], Awaitable[bool]]
"""``restore(partition, error)``: bring back what the broker said is missing; True when it is
there again."""


@dataclass
class LagPoll:
    """The last poll of every partition (see the module)."""

    nc: Connection
    topology: Topology
    metrics: AssemblerMetrics
    restore: Restore
    clock: Callable[[], float] = time.monotonic
    work: dict[int, bool] = field(default_factory=dict)
    pins: dict[int, str | None] = field(default_factory=dict)
    waited_s: dict[int, float] = field(default_factory=dict)
    missing: set[str] = field(default_factory=set)
    answered_at: float | None = None
    """``clock()`` of the last poll every partition answered."""

    async def poll(self) -> list[ConsumerState | None]:
        """One state per partition (None where the broker did not answer)."""
        t = self.topology
        states = [await self._state(p) for p in range(t.partitions)]
        if all(s is not None for s in states):
            self.answered_at = self.clock()
            unowned = [p for p, waiting in self.work.items() if waiting and not self.pins.get(p)]
            self.metrics.unowned.set(len(unowned))
        return states

    async def _state(self, partition: int) -> ConsumerState | None:
        t = self.topology
        name = t.assembler_consumer(partition)
        try:
            state = await consumer_state(self.nc, t.stream_of_partition(partition), name)
        except BrokerError as exc:
            log.warning("partition %d: %s", partition, exc)
            if missing(exc) and not await self.restore(partition, exc):
                self.missing.add(name)
            return None
        self.missing.discard(name)
        self.work[partition] = state.work
        self.pins[partition] = state.pinned(t.assembler_group)
        waited = state.waited_s()
        self.waited_s[partition] = waited
        label = str(partition)
        self.metrics.lag.labels(label).set(state.num_pending)
        self.metrics.ack_pending.labels(label).set(state.num_ack_pending)
        self.metrics.lag_seconds.labels(label).set(waited)
        return state

    def age_s(self) -> float | None:
        """Seconds since every partition last answered (None: never)."""
        return None if self.answered_at is None else self.clock() - self.answered_at
