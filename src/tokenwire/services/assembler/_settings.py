"""AssemblerSettings: everything ``tokenwire assembler`` is configured by, from the environment.

``TOKENWIRE_NATS_URL`` (required), ``TOKENWIRE_STORE`` and the topology as for every command
(:func:`tokenwire.config.load`), and the ``TOKENWIRE_ASSEMBLER_*`` rows of
:mod:`tokenwire.variables` (their parsers, defaults and meanings; docs/configuration.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from tokenwire import config
from tokenwire import variables as v
from tokenwire.broker import Topology, topology_from
from tokenwire.config import ConfigError
from tokenwire.services.assembler._assembly import AssemblyConfig


@dataclass(frozen=True)
class AssemblerSettings:
    """Resolved settings of one assembler instance. Build with :meth:`from_env` or directly.

    - ``batch_max_steps`` / ``batch_max_s``: a commit transaction holds at most this many
      steps and starts at the latest this long after the oldest waiting step closed.
    - ``backoff_initial_s`` / ``backoff_max_s``: the store retry back-off (doubling, capped).
    - ``max_pending_steps``: closed steps waiting for a commit; at the bound the handlers stop
      taking messages (a store outage fills it; nothing is acknowledged meanwhile).
    - ``burst``: drain what the stream holds, commit it, and return (tests, operators).
    - ``ack_wait_s``, ``max_deliver``, ``priority_timeout_s``: the consumers' settings, applied
      when ``provision`` is True (every start creates or updates the topology).
    - ``heartbeat_s``, ``member_ttl_s``, ``member``: membership (ADR 0016); a member silent
      for ``member_ttl_s`` is dropped by the broker. Keep the TTL at least the priority
      timeout (a pause that keeps the pins keeps the membership) and above two heartbeats.
    - ``ready_max_lag_s``: the instance is not ready (``/readyz`` 503, reason ``lag``) while
      undelivered messages of a partition it holds have waited this long without a delivery
      (the store falls behind the broker; ``_ready.py``).
    - ``handover_wait_s``: how long a hand-over waits for the partition's closed steps to
      commit before releasing the pin anyway (the next owner reads back what is unacked).
    - ``metrics_addr``: ``(host, port)`` of the metrics and probe server, None to disable.
    - ``start_timeout_s``: the bound of the first connect to the broker and of the wait for
      the store at start (``TOKENWIRE_CONNECT_TIMEOUT_S``); past it the service exits with
      one line naming what did not answer.
    - ``tune_gc``: :func:`run` applies the process-wide GC policy of ``_gc.py`` (the service
      owns its process; embedders and tests may leave the interpreter's defaults).
    """

    nats_urls: tuple[str, ...]
    store_url: str
    topology: Topology = field(default_factory=Topology)
    assembly: AssemblyConfig = field(default_factory=AssemblyConfig)
    batch_max_steps: int = v.ASSEMBLER_BATCH_STEPS.value
    batch_max_s: float = v.ASSEMBLER_BATCH_MS.value / 1000
    max_pending_steps: int = 20_000
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0
    expire_interval_s: float = 1.0
    lag_poll_s: float = 5.0
    ack_wait_s: float = v.ASSEMBLER_ACK_WAIT_S.value
    max_deliver: int = 10
    priority_timeout_s: float = v.ASSEMBLER_PRIORITY_TIMEOUT_S.value
    heartbeat_s: float = v.ASSEMBLER_HEARTBEAT_S.value
    member_ttl_s: float = v.ASSEMBLER_MEMBER_TTL_S.value
    handover_wait_s: float = 2.0
    ready_max_lag_s: float = v.ASSEMBLER_READY_MAX_LAG_S.value
    member: str = v.ASSEMBLER_MEMBER.value
    provision: bool = v.PROVISION.value
    pull_batch: int = 512
    metrics_addr: tuple[str, int] | None = v.ASSEMBLER_METRICS_ADDR.value
    burst: bool = v.ASSEMBLER_BURST.value
    tune_gc: bool = v.ASSEMBLER_TUNE_GC.value
    name: str = "tokenwire-assembler"
    start_timeout_s: float = v.CONNECT_TIMEOUT_S.value

    def __post_init__(self) -> None:
        if self.member_ttl_s < 2 * self.heartbeat_s:
            raise ConfigError(
                v.ASSEMBLER_MEMBER_TTL_S.env,
                str(self.member_ttl_s),
                "must be at least two heartbeats",
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AssemblerSettings:
        """The shared settings (:func:`tokenwire.config.load`, read once) and the assembler's
        own rows of :mod:`tokenwire.variables`, from ``env`` (default: the process
        environment).

        Raises ConfigError for a malformed value or a missing ``TOKENWIRE_NATS_URL``.
        """
        env = os.environ if env is None else env
        shared = config.load(env)
        if not shared.nats_urls:
            raise ConfigError(v.NATS_URL.env, "", "the assembler needs a NATS URL")
        provision = v.ASSEMBLER_PROVISION.read(env)
        return cls(
            nats_urls=shared.nats_urls,
            store_url=shared.store_url,
            topology=topology_from(shared),
            assembly=AssemblyConfig(
                max_open_steps=v.ASSEMBLER_MAX_OPEN_STEPS.read(env),
                gap_timeout_s=v.ASSEMBLER_GAP_TIMEOUT_S.read(env),
                abandon_timeout_s=v.ASSEMBLER_ABANDON_TIMEOUT_S.read(env),
            ),
            batch_max_steps=v.ASSEMBLER_BATCH_STEPS.read(env),
            batch_max_s=v.ASSEMBLER_BATCH_MS.read(env) / 1000,
            metrics_addr=v.ASSEMBLER_METRICS_ADDR.read(env),
            ack_wait_s=v.ASSEMBLER_ACK_WAIT_S.read(env),
            priority_timeout_s=v.ASSEMBLER_PRIORITY_TIMEOUT_S.read(env),
            heartbeat_s=v.ASSEMBLER_HEARTBEAT_S.read(env),
            member_ttl_s=v.ASSEMBLER_MEMBER_TTL_S.read(env),
            member=v.ASSEMBLER_MEMBER.read(env),
            ready_max_lag_s=v.ASSEMBLER_READY_MAX_LAG_S.read(env),
            provision=shared.provision if provision is None else provision,
            burst=v.ASSEMBLER_BURST.read(env),
            tune_gc=v.ASSEMBLER_TUNE_GC.read(env),
            start_timeout_s=shared.connect_timeout_s,
        )
