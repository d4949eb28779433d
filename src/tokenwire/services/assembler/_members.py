"""Assembler membership: a heartbeat per instance in a KV bucket whose TTL the broker enforces.

Each live instance writes ``$KV.<bucket>.<member>`` every ``heartbeat_s``; the bucket keeps one
value per key and its ``max_age`` is the member TTL, so the broker itself drops an instance
that stopped writing (crashed, partitioned away, stalled longer than the TTL). Nobody deletes
another member's key. The value says what the member holds, for the others' balance check and
for ``tokenwire status``. See ADR 0016.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import uuid
from collections.abc import Awaitable, Callable

import msgspec

from tokenwire.broker import (
    BrokerError,
    Connection,
    Restored,
    Topology,
    last_by_subject,
    publish_acked,
    stream_subjects,
)

log = logging.getLogger(__name__)

_KEY_UNSAFE = re.compile(r"[^-_=a-zA-Z0-9]")
_MAX_MEMBERS = 256
_OPERATION = "KV-Operation"


class MemberRecord(msgspec.Struct, frozen=True):
    """One heartbeat: who, its share, per held partition its pin id and messages in flight,
    and the partitions it stands by for (its allotment, ``_shares.allot``; a record without
    it, from an older version, reads as standing by for none)."""

    name: str
    share: int = 0
    pins: dict[int, str] = msgspec.field(default_factory=dict)
    in_flight: dict[int, int] = msgspec.field(default_factory=dict)
    standby: list[int] = msgspec.field(default_factory=list)

    @property
    def owned(self) -> int:
        return len(self.pins)


_record_decoder = msgspec.json.Decoder(MemberRecord)
_encoder = msgspec.json.Encoder()


def member_name(hint: str = "") -> str:
    """A KV-safe, unique member name: ``hint`` or ``<host>-<pid>-<random>``."""
    raw = hint or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    return _KEY_UNSAFE.sub("_", raw)[:64]


Restore = Callable[[], Awaitable[Restored]]
"""Create the bucket again if the broker lost it (``broker.Restorer.members``: bounded,
logged, create-only)."""


class MemberBoard:
    """Read and write the membership bucket of ``topology`` (``Topology.members_bucket``).

    ``restore``: called when a heartbeat or a read fails (the bucket may be missing: a broker
    restart lost a bucket of before issue 48, or it was deleted); when it created the bucket
    again, the heartbeat or read is tried once more.
    """

    def __init__(
        self,
        nc: Connection,
        topology: Topology,
        timeout_s: float = 2.0,
        restore: Restore | None = None,
    ) -> None:
        self._nc = nc
        self._bucket = topology.members_bucket
        self._stream = f"KV_{self._bucket}"
        self._timeout_s = timeout_s
        self._restore = restore

    def _subject(self, name: str) -> str:
        return f"$KV.{self._bucket}.{name}"

    async def _restored(self) -> bool:
        return self._restore is not None and await self._restore() == "restored"

    async def beat(self, record: MemberRecord) -> bool:
        """Write this member's heartbeat (stored before it returns); False when it failed."""
        return await self._beat(record) or (await self._restored() and await self._beat(record))

    async def _beat(self, record: MemberRecord) -> bool:
        try:
            await publish_acked(
                self._nc,
                self._subject(record.name),
                _encoder.encode(record),
                timeout_s=self._timeout_s,
            )
        except BrokerError as exc:
            log.warning("heartbeat of %s failed: %s", record.name, exc)
            return False
        return True

    async def leave(self, name: str) -> None:
        """Leave now (a graceful stop), without waiting for the TTL: a KV delete marker
        replaces the heartbeat (readers skip it; it expires like one). No purge rights needed."""
        try:
            await publish_acked(
                self._nc,
                self._subject(name),
                b"",
                headers={_OPERATION: "DEL"},
                timeout_s=self._timeout_s,
            )
        except BrokerError as exc:
            log.warning("could not leave the membership: %s", exc)

    async def names(self) -> list[str] | None:
        """The live members' names (the keys the TTL has not removed), or None on no answer."""
        names = await self._names()
        if names is None and await self._restored():
            names = await self._names()
        return names

    async def _names(self) -> list[str] | None:
        prefix = f"$KV.{self._bucket}."
        try:
            subjects = await stream_subjects(self._nc, self._stream, f"{prefix}>", self._timeout_s)
        except BrokerError as exc:
            log.warning("membership read failed: %s", exc)
            return None
        return sorted(s.removeprefix(prefix) for s in subjects)[:_MAX_MEMBERS]

    async def records(self, names: list[str]) -> dict[str, MemberRecord]:
        """The latest heartbeat of each of ``names`` (missing ones expired meanwhile)."""
        found: dict[str, MemberRecord] = {}
        for name in names:
            record = await self._get(name)
            if record is not None:
                found[name] = record
        return found

    async def read(self) -> dict[str, MemberRecord] | None:
        """Every live member's latest heartbeat, or None when the bucket did not answer."""
        names = await self.names()
        return None if names is None else await self.records(names)

    async def _get(self, name: str) -> MemberRecord | None:
        try:
            stored = await last_by_subject(
                self._nc, self._stream, self._subject(name), self._timeout_s
            )
        except BrokerError:
            return None
        if stored is None or stored.headers.get(_OPERATION):
            return None  # expired since the listing, or the member left (DEL)
        try:
            return _record_decoder.decode(stored.data)
        except msgspec.DecodeError:
            return None
