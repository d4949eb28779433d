"""The assemblers' membership for ``tokenwire status``: members, their shares, and who owns
each partition (the server's pin, named through the members' heartbeats; ADR 0016)."""

from __future__ import annotations

from typing import Any

from tokenwire.broker import Connection, Topology
from tokenwire.services.assembler._members import MemberBoard, MemberRecord


async def member_shares(nc: Connection, t: Topology) -> list[dict[str, Any]]:
    """Every live assembler: its share, the partitions it holds, what it holds in flight, and
    the partitions it stands by for (the allotment, ADR 0026)."""
    records = await MemberBoard(nc, t).read() or {}
    return [_member(r) for _, r in sorted(records.items())]


def _member(r: MemberRecord) -> dict[str, Any]:
    return {
        "name": r.name,
        "share": r.share,
        "owned": sorted(r.pins),
        "in_flight": sum(r.in_flight.values()),
        "standby": sorted(r.standby),
        "pins": {str(p): pin for p, pin in r.pins.items()},
    }


def name_owners(consumers: list[dict[str, Any]], members: list[dict[str, Any]]) -> None:
    """Add ``owner_member`` to each consumer: the member whose heartbeat reports its pin."""
    by_pin = {pin: m["name"] for m in members for pin in m["pins"].values()}
    for c in consumers:
        c["owner_member"] = by_pin.get(c["owner"]) if c.get("owner") else None
