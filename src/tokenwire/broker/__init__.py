"""Everything that talks to NATS JetStream: names, provisioning, the embedded server, the
chunk publisher, the partition consumers, the session reader and the step registry.

See docs/broker.md for the semantics and docs/adr/0002-partition-ownership.md for why
partition ownership uses JetStream priority groups.
"""

from __future__ import annotations

from tokenwire.broker._api import connect
from tokenwire.broker._assembler import AssemblerConsumers, partition_consumer
from tokenwire.broker._consumer import (
    PIN_HEADER,
    BatchHandler,
    ConsumedMessage,
    ConsumerStats,
    Handler,
    PullConsumer,
    PullSettings,
    Reject,
    Retry,
    ack_fields,
    ack_many,
    nak_many,
)
from tokenwire.broker._errors import (
    BrokerError,
    BrokerUnavailable,
    FlushTimeout,
    PayloadTooLarge,
    PublishError,
    PublishRejected,
    PublishTimeout,
    ReaderStalled,
    ServerStartError,
    StepAssignmentContention,
    StepClaimConflict,
    StepRegistryError,
    TopologyError,
)
from tokenwire.broker._ordered import ordered_subscribe, reader_name
from tokenwire.broker._provision import ensure_topology
from tokenwire.broker._publisher import ChunkPublisher, PublisherStats
from tokenwire.broker._reader import SessionReader, StoredChunk
from tokenwire.broker._retained import retained_sessions
from tokenwire.broker._server import (
    URL_FILE,
    EmbeddedCluster,
    EmbeddedServer,
    NodeConfig,
    cluster_configs,
    find_binary,
    free_port,
)
from tokenwire.broker._steps import PendingStep, StepRegistry
from tokenwire.broker._topology import (
    Topology,
    chunk_subject,
    fnv1a32,
    msg_id,
    parse_stored_subject,
    partition_of,
    stored_subject,
    valid_session,
)

PartitionConsumer = PullConsumer
"""The assembler's per-partition consumer is a grouped PullConsumer; see partition_consumer()."""

__all__ = [
    "PIN_HEADER",
    "URL_FILE",
    "AssemblerConsumers",
    "BatchHandler",
    "BrokerError",
    "BrokerUnavailable",
    "ChunkPublisher",
    "ConsumedMessage",
    "ConsumerStats",
    "EmbeddedCluster",
    "EmbeddedServer",
    "FlushTimeout",
    "Handler",
    "NodeConfig",
    "PartitionConsumer",
    "PayloadTooLarge",
    "PendingStep",
    "PublishError",
    "PublishRejected",
    "PublishTimeout",
    "PublisherStats",
    "PullConsumer",
    "PullSettings",
    "ReaderStalled",
    "Reject",
    "Retry",
    "ServerStartError",
    "SessionReader",
    "StepAssignmentContention",
    "StepClaimConflict",
    "StepRegistry",
    "StepRegistryError",
    "StoredChunk",
    "Topology",
    "TopologyError",
    "ack_fields",
    "ack_many",
    "chunk_subject",
    "cluster_configs",
    "connect",
    "ensure_topology",
    "find_binary",
    "fnv1a32",
    "free_port",
    "msg_id",
    "nak_many",
    "ordered_subscribe",
    "parse_stored_subject",
    "partition_consumer",
    "partition_of",
    "reader_name",
    "retained_sessions",
    "stored_subject",
    "valid_session",
]
