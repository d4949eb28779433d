"""What an assembler instance creates again when the broker lost it (issue 48, ADR 0035):
its membership bucket and its partition consumers (create only, bounded and logged by
``broker.Restorer``); a missing chunk stream only when the instance provisions. docs/assembler.md,
"What the broker lost"."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tokenwire.broker import BrokerError, Restored, Restorer, stream_missing
from tokenwire.services.assembler._metrics import AssemblerMetrics
from tokenwire.services.assembler._settings import AssemblerSettings


@dataclass
class Restoring:
    """``provision``: the instance's own provisioning (``ensure_topology`` with its settings)."""

    restorer: Restorer
    settings: AssemblerSettings
    metrics: AssemblerMetrics
    provision: Callable[[], Awaitable[None]]

    async def members(self) -> Restored:
        """The membership bucket (``MemberBoard``'s restore)."""
        restored = await self.restorer.members(self.settings.member_ttl_s)
        if restored == "restored":
            self.metrics.restored.labels("members").inc()
        return restored

    async def partition(self, partition: int, exc: BrokerError) -> bool:
        """The broker said ``partition``'s consumer (or its stream) is missing: True when it
        is there again. A stream is provisioned again only by an instance that provisions
        (``TOKENWIRE_ASSEMBLER_PROVISION``); otherwise it stays missing."""
        s = self.settings
        if stream_missing(exc):
            if not s.provision:
                return False
            restored = await self.restorer.provision(self.provision)
            kind = "topology"
        else:
            restored = await self.restorer.assembler_consumer(
                partition,
                ack_wait_s=s.ack_wait_s,
                max_deliver=s.max_deliver,
                priority_timeout_s=s.priority_timeout_s,
            )
            kind = "consumer"
        if restored == "restored":
            self.metrics.restored.labels(kind).inc()
        return restored in ("restored", "present")
