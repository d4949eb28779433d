"""Everything that talks to NATS JetStream: names, provisioning, the embedded server, the
chunk publisher, the partition consumers, the session reader, the step registry, and the
operations services need beside them (consumer state, unpin, dead-lettering, events and
acknowledged writes, reads by subject, range reads, the connected server).

The boundary is closed: no module outside this package imports ``nats``; a nats-py error
leaves it translated once (``_translate.py``) into a :class:`BrokerError` leaf.

See docs/broker.md for the semantics and docs/adr/0002-partition-ownership.md for why
partition ownership uses JetStream priority groups.
"""

from __future__ import annotations

from tokenwire.broker import _deferred  # noqa: F401  (before nats-py: see its docstring)
from tokenwire.broker._allowances import Allowances, Hold, MemoryAllowances, Pool
from tokenwire.broker._api import Connection, cancel_task, connect, ended
from tokenwire.broker._batches import (
    READ_IDLE_TIMEOUT_S,
    READ_MAX_BATCH,
    RawChunk,
    first_chunks,
    session_batches,
)
from tokenwire.broker._bounded import ReadWindow
from tokenwire.broker._claims import StepClaims
from tokenwire.broker._consumed import ConsumedMessage, ack_fields
from tokenwire.broker._consumer import (
    PIN_HEADER,
    BatchHandler,
    ConsumerStats,
    Handler,
    PullConsumer,
    PullSettings,
    Reject,
    Retry,
    ack_many,
    nak_many,
    reset,
    unpin,
)
from tokenwire.broker._cooldowns import (
    Cooldowns,
    CooldownWatch,
    Cooling,
    DeploymentState,
    Healthy,
    ProbeClaim,
    ProbeDue,
    Probing,
)
from tokenwire.broker._deadletter import dead_letter, dead_letter_headers
from tokenwire.broker._errors import (
    BrokerError,
    BrokerUnavailable,
    FlushTimeout,
    LayoutConflict,
    PayloadTooLarge,
    PublishError,
    PublishRejected,
    PublishTimeout,
    ReaderStalled,
    RegistryLayoutConflict,
    RequestFailed,
    ReshardRefused,
    ServerStartError,
    StepAssignmentContention,
    StepClaimConflict,
    StepRegistryError,
    TopologyError,
)
from tokenwire.broker._events import EventPublisher
from tokenwire.broker._frames import header_size
from tokenwire.broker._inspect import (
    ConsumerState,
    ServerInfo,
    consumer_state,
    jetstream_request,
    server_info,
    stream_info,
    stream_subjects,
)
from tokenwire.broker._keys import KINDS, EntryKind, KeyEntry, KeysBucket, KeysWatch
from tokenwire.broker._keys_memory import MemoryKeys
from tokenwire.broker._layout import (
    check_layout,
    check_registry_layout,
    locate_session,
    retired_layouts,
    shard_leaders,
    spread_leaders,
)
from tokenwire.broker._memory import (
    MemoryCooldowns,
    MemoryPublisher,
    MemorySessionOwners,
    MemoryStepRegistry,
    Published,
)
from tokenwire.broker._messages import (
    StoredAt,
    StoredMessage,
    last_by_subject,
    next_stored,
    publish_acked,
    publish_event,
    stored_with_msg_id,
)
from tokenwire.broker._ordered import ordered_subscribe, read_range, reader_name
from tokenwire.broker._owners import Owner, SessionOwners, session_owner
from tokenwire.broker._partitions import partition_consumer
from tokenwire.broker._ports import free_port
from tokenwire.broker._protocol import (
    AllowanceBoard,
    BoardWatch,
    ChunkSink,
    CooldownBoard,
    KeyBook,
    PendingAssignment,
    SessionOwnership,
    StepAllocator,
)
from tokenwire.broker._provision import (
    ensure_cooldowns_bucket,
    ensure_keys_bucket,
    ensure_limits_bucket,
    ensure_topology,
    reshard,
)
from tokenwire.broker._publisher import ChunkPublisher, PublisherStats
from tokenwire.broker._reader import SessionReader, StoredChunk
from tokenwire.broker._restore import Restored, Restorer, missing, stream_missing
from tokenwire.broker._retained import retained_sessions
from tokenwire.broker._server import (
    URL_FILE,
    EmbeddedCluster,
    EmbeddedServer,
    NodeConfig,
    cluster_configs,
    find_binary,
)
from tokenwire.broker._step_record import (
    AMBIGUOUS,
    DEFAULT_CLAIM_IDLE_S,
    KeyBinding,
    StepNames,
    StepRecord,
    ThreadMark,
)
from tokenwire.broker._step_registry import PendingStep, RegistryBucket, StepRegistry
from tokenwire.broker._topology import (
    Topology,
    chunk_subject,
    fnv1a32,
    msg_id,
    parse_stored_subject,
    partition_of,
    stored_subject,
    topology_from,
    valid_session,
)

PartitionConsumer = PullConsumer
"""The assembler's per-partition consumer is a grouped PullConsumer; see partition_consumer()."""

__all__ = [
    "AMBIGUOUS",
    "DEFAULT_CLAIM_IDLE_S",
    "KINDS",
    "PIN_HEADER",
    "READ_IDLE_TIMEOUT_S",
    "READ_MAX_BATCH",
    "URL_FILE",
    "AllowanceBoard",
    "Allowances",
    "BatchHandler",
    "BoardWatch",
    "BrokerError",
    "BrokerUnavailable",
    "ChunkPublisher",
    "ChunkSink",
    "Connection",
    "ConsumedMessage",
    "ConsumerState",
    "ConsumerStats",
    "CooldownBoard",
    "CooldownWatch",
    "Cooldowns",
    "Cooling",
    "DeploymentState",
    "EmbeddedCluster",
    "EmbeddedServer",
    "EntryKind",
    "EventPublisher",
    "FlushTimeout",
    "Handler",
    "Healthy",
    "Hold",
    "KeyBinding",
    "KeyBook",
    "KeyEntry",
    "KeysBucket",
    "KeysWatch",
    "LayoutConflict",
    "MemoryAllowances",
    "MemoryCooldowns",
    "MemoryKeys",
    "MemoryPublisher",
    "MemorySessionOwners",
    "MemoryStepRegistry",
    "NodeConfig",
    "Owner",
    "PartitionConsumer",
    "PayloadTooLarge",
    "PendingAssignment",
    "PendingStep",
    "Pool",
    "ProbeClaim",
    "ProbeDue",
    "Probing",
    "PublishError",
    "PublishRejected",
    "PublishTimeout",
    "Published",
    "PublisherStats",
    "PullConsumer",
    "PullSettings",
    "RawChunk",
    "ReadWindow",
    "ReaderStalled",
    "RegistryBucket",
    "RegistryLayoutConflict",
    "Reject",
    "RequestFailed",
    "ReshardRefused",
    "Restored",
    "Restorer",
    "Retry",
    "ServerInfo",
    "ServerStartError",
    "SessionOwners",
    "SessionOwnership",
    "SessionReader",
    "StepAllocator",
    "StepAssignmentContention",
    "StepClaimConflict",
    "StepClaims",
    "StepNames",
    "StepRecord",
    "StepRegistry",
    "StepRegistryError",
    "StoredAt",
    "StoredChunk",
    "StoredMessage",
    "ThreadMark",
    "Topology",
    "TopologyError",
    "ack_fields",
    "ack_many",
    "cancel_task",
    "check_layout",
    "check_registry_layout",
    "chunk_subject",
    "cluster_configs",
    "connect",
    "consumer_state",
    "dead_letter",
    "dead_letter_headers",
    "ended",
    "ensure_cooldowns_bucket",
    "ensure_keys_bucket",
    "ensure_limits_bucket",
    "ensure_topology",
    "find_binary",
    "first_chunks",
    "fnv1a32",
    "free_port",
    "header_size",
    "jetstream_request",
    "last_by_subject",
    "locate_session",
    "missing",
    "msg_id",
    "nak_many",
    "next_stored",
    "ordered_subscribe",
    "parse_stored_subject",
    "partition_consumer",
    "partition_of",
    "publish_acked",
    "publish_event",
    "read_range",
    "reader_name",
    "reset",
    "reshard",
    "retained_sessions",
    "retired_layouts",
    "server_info",
    "session_batches",
    "session_owner",
    "shard_leaders",
    "spread_leaders",
    "stored_subject",
    "stored_with_msg_id",
    "stream_info",
    "stream_missing",
    "stream_subjects",
    "topology_from",
    "unpin",
    "valid_session",
]
