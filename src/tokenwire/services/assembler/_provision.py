"""The assembler's streams and consumers, created or updated from its settings."""

from __future__ import annotations

from tokenwire.broker import Connection, ensure_topology
from tokenwire.services.assembler._settings import AssemblerSettings


async def provision(nc: Connection, settings: AssemblerSettings) -> None:
    """Create or update the streams and consumers (idempotent; every process may call it)."""
    await ensure_topology(
        nc,
        settings.topology,
        ack_wait_s=settings.ack_wait_s,
        max_deliver=settings.max_deliver,
        priority_timeout_s=settings.priority_timeout_s,
        member_ttl_s=settings.member_ttl_s,
    )
