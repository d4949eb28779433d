"""Names: every subject, stream, consumer and key is derived from one :class:`Topology`.

Tests isolate themselves on a shared server by using a unique prefix and stream names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193
_SESSION_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")


@dataclass(frozen=True, slots=True)
class Topology:
    """Where tokenwire's data lives on the broker.

    ``max_bytes`` caps the chunk stream; the events and DLQ streams get an eighth each (the
    server reserves these against its file store limit). ``duplicate_window_s`` must exceed
    the publisher's retry horizon (30 s by default), so a retried publish is always
    recognised as a duplicate.
    """

    prefix: str = "tw"
    stream: str = "TOKENWIRE"
    events_stream: str = "TOKENWIRE_EVENTS"
    dlq_stream: str = "TOKENWIRE_DLQ"
    steps_bucket: str = "tokenwire-steps"
    partitions: int = 16
    replicas: int = 1
    max_age_s: float = 7 * 24 * 3600.0
    max_bytes: int = 4 * 1024**3
    duplicate_window_s: float = 120.0
    assembler_group: str = "assemblers"
    telemetry_consumer: str = "telemetry"

    @property
    def input_subjects(self) -> str:
        """What the gateway publishes to: ``<prefix>.in.<session>.<kind>``."""
        return f"{self.prefix}.in.*.*"

    @property
    def stored_pattern(self) -> str:
        """The stream's subject transform destination (the broker computes the partition)."""
        n = self.partitions
        return (
            f"{self.prefix}.chunks.{{{{partition({n},1)}}}}.{{{{wildcard(1)}}}}.{{{{wildcard(2)}}}}"
        )

    @property
    def members_bucket(self) -> str:
        """The KV bucket of live assembler instances (heartbeats with a broker-enforced TTL)."""
        return f"{self.stream.lower()}-assemblers"

    def partition_filter(self, partition: int) -> str:
        """Every chunk of one partition: ``<prefix>.chunks.<p>.>``."""
        return f"{self.prefix}.chunks.{partition}.>"

    @property
    def first_chunks_filter(self) -> str:
        """The first chunk of every step, on every partition (the telemetry feed)."""
        return f"{self.prefix}.chunks.*.*.first"

    def assembler_consumer(self, partition: int) -> str:
        """The durable consumer name of one partition: ``assembler-p<i>``."""
        return f"assembler-p{partition}"

    def session_filter(self, session: str) -> str:
        """Every stored chunk of one session: ``<prefix>.chunks.<p>.<session>.*``."""
        return f"{self.prefix}.chunks.{partition_of(session, self.partitions)}.{session}.*"

    def event_subject(self, session: str, kind: str = "persisted") -> str:
        """A session event, e.g. ``tw.events.<session>.persisted``."""
        return f"{self.prefix}.events.{session}.{kind}"

    def dlq_subject(self, consumer: str) -> str:
        """Where a consumer dead-letters what it terminated: ``<prefix>.dlq.<consumer>``."""
        return f"{self.prefix}.dlq.{consumer}"

    @property
    def telemetry_live_subject(self) -> str:
        """The core-NATS (not stored) stream-started signal."""
        return f"{self.prefix}.telemetry.started"


def fnv1a32(data: bytes) -> int:
    """FNV-1a, 32 bit: the hash behind nats-server's ``{{partition(n,i)}}`` mapping."""
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h


def partition_of(session: str, partitions: int) -> int:
    """The partition the broker files ``session`` under: ``fnv1a32(session) % partitions``.

    >>> partition_of("abc", 16)
    11
    """
    return fnv1a32(session.encode()) % partitions


def valid_session(session: str) -> bool:
    """Session ids are letters, digits, ``-`` and ``_``, 1 to 128 of them (one subject token)."""
    return _SESSION_RE.fullmatch(session) is not None


def chunk_subject(topology: Topology, session: str, first: bool) -> str:
    """The publish subject of a chunk: ``<prefix>.in.<session>.first|next``."""
    return f"{topology.prefix}.in.{session}.{'first' if first else 'next'}"


def stored_subject(topology: Topology, session: str, first: bool) -> str:
    """The subject the stream stores that chunk under: ``<prefix>.chunks.<p>.<session>.<kind>``."""
    kind = "first" if first else "next"
    return f"{topology.prefix}.chunks.{partition_of(session, topology.partitions)}.{session}.{kind}"


def msg_id(session: str, turn: int, step: int, ordinal: int) -> str:
    """The dedupe id of one chunk: ``"<session>:<turn>:<step>:<ordinal>"``."""
    return f"{session}:{turn}:{step}:{ordinal}"


def parse_stored_subject(topology: Topology, subject: str) -> tuple[int, str, bool]:
    """``(partition, session, first)`` of a stored chunk subject; ValueError if it is not one."""
    parts = subject.split(".")
    head = topology.prefix.split(".")
    if len(parts) != len(head) + 4 or parts[: len(head)] != head:
        raise ValueError(f"not a chunk subject: {subject!r}")
    chunks, p, session, kind = parts[len(head) :]
    if chunks != "chunks" or kind not in ("first", "next") or not p.isdigit():
        raise ValueError(f"not a chunk subject: {subject!r}")
    return int(p), session, kind == "first"
