"""The assembler's Prometheus metrics (one registry per instance). They are served with
``/healthz`` and ``/readyz`` (200 or 503, its body the reasons: ``_ready.py``) by
``tokenwire.observability.ProbeServer``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tokenwire.observability import ProbeServer, probe_app
from tokenwire.services.assembler._usage_metrics import UsageMetrics

_NS = "tokenwire_assembler"
__all__ = ["AssemblerMetrics", "ProbeServer", "probe_app"]


@dataclass
class AssemblerMetrics:
    """Every metric of one assembler instance, in its own registry (several fit in a process)."""

    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.chunks = Counter(f"{_NS}_chunks", "Chunk messages handled.", registry=r)
        self.steps = Counter(
            f"{_NS}_steps", "Steps committed, by how they closed.", ["reason"], registry=r
        )
        self.messages = Counter(f"{_NS}_messages", "Assembled messages committed.", registry=r)
        self.errors = Counter(
            f"{_NS}_errors", "Recorded step errors committed, by kind.", ["kind"], registry=r
        )
        self.duplicates = Counter(
            f"{_NS}_duplicates",
            "Chunks of steps already closed or stored (redeliveries, duplicate publishes).",
            ["where"],
            registry=r,
        )
        self.dead_lettered = Counter(
            f"{_NS}_dead_lettered",
            "Messages sent to the dead-letter subject.",
            ["reason"],
            registry=r,
        )
        self.events_given_up = Counter(
            f"{_NS}_events_given_up",
            "Persisted events not stored within 60 s of tries, or unacknowledged at shutdown "
            "(the steps themselves are committed).",
            registry=r,
        )
        self.events_pending = Gauge(
            f"{_NS}_events_pending",
            "Persisted events published and not acknowledged yet.",
            registry=r,
        )
        self.store_failures = Counter(
            f"{_NS}_store_failures", "Store calls that failed, by error.", ["error"], registry=r
        )
        self.commit_seconds = Histogram(
            f"{_NS}_commit_seconds",
            "Latency of one commit transaction.",
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.batch_steps = Histogram(
            f"{_NS}_batch_steps",
            "Steps per commit transaction.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
            registry=r,
        )
        self.open_steps = Gauge(f"{_NS}_open_steps", "Steps waiting for chunks.", registry=r)
        self.pending_steps = Gauge(
            f"{_NS}_pending_steps", "Closed steps waiting for their commit.", registry=r
        )
        self.lag = Gauge(
            f"{_NS}_lag_messages",
            "Messages not yet delivered, per partition (num_pending).",
            ["partition"],
            registry=r,
        )
        self.ack_pending = Gauge(
            f"{_NS}_ack_pending_messages",
            "Delivered, unacknowledged messages per partition.",
            ["partition"],
            registry=r,
        )
        self.lag_seconds = Gauge(
            f"{_NS}_lag_seconds",
            "Seconds the partition's undelivered messages have waited without a delivery "
            "(0 when none waits), by the broker's clock: how far the store is behind.",
            ["partition"],
            registry=r,
        )
        self.unowned = Gauge(
            f"{_NS}_unowned_partitions",
            "Partitions with messages waiting (undelivered or unacknowledged) whose consumer "
            "pins no client, as last polled.",
            registry=r,
        )
        self.ready = Gauge(
            f"{_NS}_ready",
            "1 when the instance can do its job (/readyz answers 200).",
            registry=r,
        )
        self.not_ready = Gauge(
            f"{_NS}_not_ready",
            "1 for each reason the instance is not ready (docs/assembler.md, Readiness).",
            ["reason"],
            registry=r,
        )
        self.expiry = Counter(
            f"{_NS}_expiry_steps",
            "Steps past their timeout, by what the broker showed: closed (they cannot finish), "
            "handed-back (their partition is held elsewhere), waiting (behind, a live claim, "
            "or no answer; counted each pass).",
            ["outcome"],
            registry=r,
        )
        self.restored = Counter(
            f"{_NS}_restored",
            "Objects the broker said were missing and this instance created again, by kind "
            "(members, consumer, topology).",
            ["kind"],
            registry=r,
        )
        self.owned_partitions = Gauge(
            f"{_NS}_owned_partitions", "Partitions this instance holds the pin of.", registry=r
        )
        self.store_up = Gauge(
            f"{_NS}_store_up", "1 when the last store call succeeded, else 0.", registry=r
        )
        self.usage = UsageMetrics(r)
        self._membership(r)

    def _membership(self, r: CollectorRegistry) -> None:
        """Elastic shares (ADR 0016): membership, share, hand-overs, time to balance."""
        self.members = Gauge(f"{_NS}_members", "Live assemblers in this view.", registry=r)
        self.share = Gauge(
            f"{_NS}_share_partitions", "Partitions this instance's fair share is.", registry=r
        )
        self.balanced = Gauge(
            f"{_NS}_balanced", "1 when every live member holds exactly its share.", registry=r
        )
        self.unbalanced_seconds = Gauge(
            f"{_NS}_unbalanced_seconds",
            "Seconds since the membership changed while ownership is not balanced yet (0 when "
            "balanced).",
            registry=r,
        )
        self.rebalance_seconds = Histogram(
            f"{_NS}_rebalance_seconds",
            "From a membership change (join, leave, expiry) to balanced ownership.",
            buckets=(0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30, 60, 120),
            registry=r,
        )
        self.read_backs = Counter(
            f"{_NS}_read_backs",
            "Partition read-backs from the stream, by cause (pin, lost, tail) and outcome.",
            ["cause", "outcome"],
            registry=r,
        )
        self.resets = Counter(
            f"{_NS}_consumer_resets",
            "Partition consumers reset to deliver again what a holder gone held, by outcome "
            "(ok, failed).",
            ["outcome"],
            registry=r,
        )
        self.handovers = Counter(
            f"{_NS}_handovers", "Partitions this instance handed over (UNPIN).", registry=r
        )
        self.handover_seconds = Histogram(
            f"{_NS}_handover_seconds",
            "From pausing a partition to its release (waiting for its in-flight commits).",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5),
            registry=r,
        )
