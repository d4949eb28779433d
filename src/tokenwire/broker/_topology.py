"""Names: every subject, stream, consumer and key is derived from one :class:`Topology`.

Tests isolate themselves on a shared server by using a unique prefix and stream names.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from tokenwire.config import COMPRESSIONS, MAX_REGISTRY_SHARDS, Settings
from tokenwire.variables import (
    COMPRESSION,
    PARTITIONS,
    REGISTRY_SHARDS,
    REPLICAS,
    RETENTION_AGE_S,
    RETENTION_BYTES,
    SHARD_TAGS,
    SHARDS,
)

_FNV_OFFSET = 0x811C9DC5
_FNV_PRIME = 0x01000193
_SESSION_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")


@dataclass(frozen=True, slots=True)
class Topology:
    """Where tokenwire's data lives on the broker.

    The chunks live in ``shards`` (K) streams, each its own raft group: shard ``k`` owns the
    contiguous partitions ``[k*P//K, (k+1)*P//K)`` of the ``partitions`` (P) and stores their
    subjects ``<prefix>.chunks.<p>.<session>.<first|next>``. With K = 1 the one stream keeps
    the name ``stream`` (``TOKENWIRE``); with K > 1 the names encode the layout
    (``<stream>_K4_P16_S0`` .. ``_S3``), so streams of two layouts are never confused.

    ``max_bytes`` is the retention budget of all chunk streams together, split evenly over
    the shards (``shard_max_bytes``); the events and DLQ streams get an eighth each (the
    server reserves these against its file store limit). ``duplicate_window_s`` must exceed
    the publisher's retry horizon (30 s by default), so a retried publish is always
    recognised as a duplicate. ``shard_tags``: placement tags, shard k gets tag
    ``k mod len(shard_tags)`` (none: JetStream places each raft group itself).
    ``compression``: ``s2`` or ``none`` for the chunk streams (ADR 0023).

    The step registry lives in ``registry_shards`` (R) KV buckets, each its own raft group: a
    session's keys (its pointer, its claims, its owner record) in bucket
    ``partition_of(session, R)``, an idempotency key's binding in ``partition_of(hash, R)``.
    With R = 1 the one bucket keeps the name ``steps_bucket`` (``tokenwire-steps``); with
    R > 1 the names encode R (``tokenwire-steps-r4-0`` .. ``-r4-3``). R is fixed per
    deployment: a session's pointer must never move, or its step numbers would restart
    (provisioning refuses another R, ``RegistryLayoutConflict``); it is independent of K,
    which ``tokenwire reshard`` changes.

    The session events (``persisted``, ``started``: two writes per step, like the registry)
    follow R too: events stream ``r`` holds ``<prefix>.events.<r>.<session>.<kind>`` for the
    sessions whose registry bucket is ``r`` (``registry_shard_of(session, R)``). With R = 1
    the one stream keeps the name ``events_stream`` (``TOKENWIRE_EVENTS``) and its subjects
    ``<prefix>.events.>``; with R > 1 the names encode R (``<events_stream>_R4_0`` ..
    ``_R4_3``), each stream ``<prefix>.events.<r>.*.*``. A subscriber needs no hash:
    ``<prefix>.events.*.<session>.persisted`` matches whichever r.
    """

    prefix: str = "tw"
    stream: str = "TOKENWIRE"
    events_stream: str = "TOKENWIRE_EVENTS"
    dlq_stream: str = "TOKENWIRE_DLQ"
    steps_bucket: str = "tokenwire-steps"
    partitions: int = PARTITIONS.value
    shards: int = SHARDS.value
    replicas: int = REPLICAS.value
    max_age_s: float = RETENTION_AGE_S.value
    max_bytes: int = RETENTION_BYTES.value
    duplicate_window_s: float = 120.0
    assembler_group: str = "assemblers"
    telemetry_consumer: str = "telemetry"
    shard_tags: tuple[str, ...] = SHARD_TAGS.value
    compression: str = COMPRESSION.value
    registry_shards: int = REGISTRY_SHARDS.value

    def __post_init__(self) -> None:
        if not 1 <= self.shards <= self.partitions:
            raise ValueError(f"shards must be 1..partitions ({self.partitions}): {self.shards}")
        if not 1 <= self.registry_shards <= MAX_REGISTRY_SHARDS:
            raise ValueError(
                f"registry_shards must be 1..{MAX_REGISTRY_SHARDS}: {self.registry_shards}"
            )
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}: {self.compression!r}")

    @property
    def layout(self) -> str:
        """``K=<shards> P=<partitions>``: what a chunk stream name encodes."""
        return f"K={self.shards} P={self.partitions}"

    def shard_of_partition(self, partition: int) -> int:
        """The shard owning ``partition``: the k with ``k*P//K <= partition < (k+1)*P//K``."""
        if not 0 <= partition < self.partitions:
            raise ValueError(f"partition {partition} outside 0..{self.partitions - 1}")
        return ((partition + 1) * self.shards - 1) // self.partitions

    def shard_partitions(self, shard: int) -> range:
        """The partitions shard ``shard`` owns: ``range(k*P//K, (k+1)*P//K)``."""
        p, k = self.partitions, self.shards
        return range(shard * p // k, (shard + 1) * p // k)

    def shard_stream(self, shard: int) -> str:
        """Shard ``shard``'s stream: ``stream`` when K = 1, else ``<stream>_K<K>_P<P>_S<k>``."""
        if self.shards == 1:
            return self.stream
        return f"{self.stream}_K{self.shards}_P{self.partitions}_S{shard}"

    def stream_of_partition(self, partition: int) -> str:
        """The chunk stream holding ``partition``'s subjects."""
        return self.shard_stream(self.shard_of_partition(partition))

    def stream_of(self, session: str) -> str:
        """The chunk stream holding ``session``'s chunks (its partition's shard)."""
        return self.stream_of_partition(partition_of(session, self.partitions))

    @property
    def chunk_streams(self) -> tuple[str, ...]:
        """Every chunk stream of this layout, shard 0 first."""
        return tuple(self.shard_stream(k) for k in range(self.shards))

    def shard_subjects(self, shard: int) -> list[str]:
        """What shard ``shard``'s stream stores: ``<prefix>.chunks.<p>.*.*`` per partition."""
        return [f"{self.prefix}.chunks.{p}.*.*" for p in self.shard_partitions(shard)]

    @property
    def shard_max_bytes(self) -> int:
        """Each chunk stream's ``max_bytes``: the budget ``max_bytes`` split over the shards."""
        return self.max_bytes // self.shards

    @property
    def chunks_wildcard(self) -> str:
        """Every chunk subject of every partition: ``<prefix>.chunks.>``."""
        return f"{self.prefix}.chunks.>"

    @property
    def legacy_input_subjects(self) -> str:
        """What the gateway published to before shards (``<prefix>.in.*.*``, turned into
        chunk subjects by a subject transform on the one stream); provisioning replaces it."""
        return f"{self.prefix}.in.*.*"

    def registry_bucket(self, shard: int) -> str:
        """Registry shard ``shard``'s KV bucket: ``steps_bucket`` when R = 1, else
        ``<steps_bucket>-r<R>-<shard>``."""
        sharded = f"{self.steps_bucket}-r{self.registry_shards}-{shard}"
        return self._per_registry_shard("registry shard", shard, self.steps_bucket, sharded)

    @property
    def registry_buckets(self) -> tuple[str, ...]:
        """Every registry bucket of this layout, shard 0 first."""
        return tuple(self.registry_bucket(r) for r in range(self.registry_shards))

    def registry_bucket_of(self, key: str) -> str:
        """The registry bucket of a session (or an idempotency key's hash):
        ``partition_of(key, R)``."""
        return self.registry_bucket(registry_shard_of(key, self.registry_shards))

    @property
    def members_bucket(self) -> str:
        """The KV bucket of live assembler instances (heartbeats with a broker-enforced TTL)."""
        return f"{self.stream.lower()}-assemblers"

    @property
    def cooldowns_bucket(self) -> str:
        """The KV bucket of the routed deployments' shared cooldowns (``broker._cooldowns``,
        ADR 0040): ``tokenwire-cooldowns``."""
        return f"{self.stream.lower()}-cooldowns"

    @property
    def keys_bucket(self) -> str:
        """The KV bucket of the gateway keys and tenants (``broker._keys``, ADR 0041):
        ``tokenwire-keys``."""
        return f"{self.stream.lower()}-keys"

    @property
    def limits_bucket(self) -> str:
        """The KV bucket of the keys' and tenants' shared allowances (``broker._allowances``,
        ADR 0042): ``tokenwire-limits``."""
        return f"{self.stream.lower()}-limits"

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

    def events_shard_stream(self, shard: int) -> str:
        """Events shard ``shard``'s stream: ``events_stream`` when R = 1, else
        ``<events_stream>_R<R>_<shard>``."""
        sharded = f"{self.events_stream}_R{self.registry_shards}_{shard}"
        return self._per_registry_shard("events shard", shard, self.events_stream, sharded)

    def _per_registry_shard(self, what: str, shard: int, single: str, sharded: str) -> str:
        """``single`` when R = 1, else ``sharded``; ValueError for a shard outside 0..R-1."""
        if not 0 <= shard < self.registry_shards:
            raise ValueError(f"{what} {shard} outside 0..{self.registry_shards - 1}")
        return single if self.registry_shards == 1 else sharded

    @property
    def events_streams(self) -> tuple[str, ...]:
        """Every events stream of this layout, shard 0 first."""
        return tuple(self.events_shard_stream(r) for r in range(self.registry_shards))

    def events_shard_subjects(self, shard: int) -> str:
        """What events shard ``shard``'s stream stores: ``<prefix>.events.>`` when R = 1
        (also the events published before the shard token, which age out there), else
        ``<prefix>.events.<shard>.*.*``."""
        if self.registry_shards == 1:
            return f"{self.prefix}.events.>"
        return f"{self.prefix}.events.{shard}.*.*"

    def events_stream_of(self, session: str) -> str:
        """The events stream holding ``session``'s events (its registry shard's)."""
        return self.events_shard_stream(registry_shard_of(session, self.registry_shards))

    def event_subject(self, session: str, kind: str = "persisted") -> str:
        """A session event, ``<prefix>.events.<r>.<session>.<kind>`` with ``r`` the session's
        registry shard, e.g. ``tw.events.0.sess-1.persisted``."""
        shard = registry_shard_of(session, self.registry_shards)
        return f"{self.prefix}.events.{shard}.{session}.{kind}"

    def events_filter(self, kind: str) -> str:
        """One kind of event of every session: ``<prefix>.events.*.*.<kind>``."""
        return f"{self.prefix}.events.*.*.{kind}"

    def dlq_subject(self, consumer: str) -> str:
        """Where a consumer dead-letters what it terminated: ``<prefix>.dlq.<consumer>``."""
        return f"{self.prefix}.dlq.{consumer}"

    @property
    def telemetry_live_subject(self) -> str:
        """The core-NATS (not stored) stream-started signal."""
        return f"{self.prefix}.telemetry.started"


def topology_from(settings: Settings) -> Topology:
    """The topology the shared settings describe (``TOKENWIRE_PARTITIONS``, ``_SHARDS``,
    ``_SHARD_TAGS``, ``_REPLICAS``, ``_RETENTION_BYTES``, ``_RETENTION_AGE_S``,
    ``_COMPRESSION``, ``_REGISTRY_SHARDS``); names keep their defaults."""
    return Topology(
        partitions=settings.partitions,
        shards=settings.shards,
        replicas=settings.replicas,
        max_bytes=settings.retention_bytes,
        max_age_s=settings.retention_age_s,
        shard_tags=settings.shard_tags,
        compression=settings.compression,
        registry_shards=settings.registry_shards,
    )


def fnv1a32(data: bytes) -> int:
    """FNV-1a, 32 bit: the hash behind nats-server's ``{{partition(n,i)}}`` mapping."""
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFF
    return h


@functools.lru_cache(maxsize=16_384)
def partition_of(session: str, partitions: int) -> int:
    """The partition of ``session``: ``fnv1a32(session) % partitions``, the function of the
    broker's ``{{partition(n,1)}}`` mapping (a test compares them on the real server).

    Memoised (16,384 recent sessions): the gateway computes it for every chunk it publishes,
    and the byte loop costs ~3 us for a 36-character id against ~0.1 us for a cache hit.

    >>> partition_of("abc", 16)
    11
    """
    return fnv1a32(session.encode()) % partitions


def registry_shard_of(key: str, registry_shards: int) -> int:
    """The registry shard of a session (or an idempotency key's hash): its partition among
    ``registry_shards``, the one rule the registry and :meth:`Topology.registry_bucket_of`
    route by."""
    return partition_of(key, registry_shards)


def valid_session(session: str) -> bool:
    """Session ids are letters, digits, ``-`` and ``_``, 1 to 128 of them (one subject token)."""
    return _SESSION_RE.fullmatch(session) is not None


def chunk_subject(topology: Topology, session: str, first: bool) -> str:
    """The subject a chunk is published and stored under:
    ``<prefix>.chunks.<p>.<session>.first|next`` with ``p = partition_of(session, P)``."""
    kind = "first" if first else "next"
    return f"{topology.prefix}.chunks.{partition_of(session, topology.partitions)}.{session}.{kind}"


stored_subject = chunk_subject
"""The same subject: the gateway publishes straight to the stored subject (no transform)."""


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
