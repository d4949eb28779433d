"""AssemblerSettings: everything ``tokenwire assembler`` is configured by, from the environment.

``TOKENWIRE_NATS_URL`` (required), ``TOKENWIRE_STORE`` and ``TOKENWIRE_PARTITIONS`` as for
every command (tokenwire.config), and ``TOKENWIRE_ASSEMBLER_<NAME>``:

| NAME | default | meaning |
| --- | --- | --- |
| ``BATCH_STEPS`` | ``256`` | commit when this many steps closed |
| ``BATCH_MS`` | ``20`` | ... or when the oldest closed step waited this long |
| ``GAP_TIMEOUT_S`` | ``30`` | finish seen, chunks missing: close as ``gap`` |
| ``ABANDON_TIMEOUT_S`` | ``120`` | no finish, no chunk: close as ``abandoned`` |
| ``MAX_OPEN_STEPS`` | ``20000`` | steps in memory; at the bound, stop pulling |
| ``METRICS_ADDR`` | ``127.0.0.1:9465`` | metrics and probes; ``off`` disables |
| ``ACK_WAIT_S`` | ``300`` | consumer ack_wait (redelivery of a dead owner's messages) |
| ``PRIORITY_TIMEOUT_S`` | ``5`` | the pin moves to a standby after this long without pulls |
| ``HEARTBEAT_S`` | ``1`` | membership heartbeat period (ADR 0016) |
| ``MEMBER_TTL_S`` | ``6`` | the broker drops a member silent this long (>= the priority timeout) |
| ``MEMBER`` | ``<host>-<pid>-<random>`` | this instance's member name |
| ``PROVISION`` | ``1`` | create/update streams and consumers at start (``0``: leave them) |
| ``BURST`` | ``0`` | ``1``: drain what the stream holds, commit, exit |
| ``TUNE_GC`` | ``1`` | apply the process GC policy at start (``_gc.py``); ``0``: defaults |
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from tokenwire import config
from tokenwire.broker import Topology, topology_from
from tokenwire.config import ConfigError
from tokenwire.services.assembler._assembly import AssemblyConfig

DEFAULT_METRICS_ADDR = "127.0.0.1:9465"


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
    batch_max_steps: int = 256
    batch_max_s: float = 0.02
    max_pending_steps: int = 20_000
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0
    expire_interval_s: float = 1.0
    lag_poll_s: float = 5.0
    ack_wait_s: float = 300.0
    max_deliver: int = 10
    priority_timeout_s: float = 5.0
    heartbeat_s: float = 1.0
    member_ttl_s: float = 6.0
    handover_wait_s: float = 2.0
    member: str = ""
    provision: bool = True
    pull_batch: int = 512
    metrics_addr: tuple[str, int] | None = ("127.0.0.1", 9465)
    burst: bool = False
    tune_gc: bool = True
    name: str = "tokenwire-assembler"
    start_timeout_s: float = config.DEFAULT_CONNECT_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.member_ttl_s < 2 * self.heartbeat_s:
            raise ConfigError(
                _key("MEMBER_TTL_S"), str(self.member_ttl_s), "must be at least two heartbeats"
            )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AssemblerSettings:
        """Read the settings from ``env`` (default: the process environment).

        Raises ConfigError for a malformed value or a missing ``TOKENWIRE_NATS_URL``.
        """
        env = os.environ if env is None else env
        base = config.load(env)
        if not base.nats_urls:
            raise ConfigError("TOKENWIRE_NATS_URL", "", "the assembler needs a NATS URL")
        return cls(
            nats_urls=base.nats_urls,
            store_url=base.store_url,
            topology=topology_from(base),
            assembly=_assembly_config(env),
            batch_max_steps=_int(env, "BATCH_STEPS", 256),
            batch_max_s=_int(env, "BATCH_MS", 20) / 1000,
            metrics_addr=_metrics_addr(env),
            ack_wait_s=_seconds(env, "ACK_WAIT_S", 300.0),
            priority_timeout_s=_seconds(env, "PRIORITY_TIMEOUT_S", 5.0),
            heartbeat_s=_seconds(env, "HEARTBEAT_S", 1.0),
            member_ttl_s=_seconds(env, "MEMBER_TTL_S", 6.0),
            member=env.get(_key("MEMBER"), ""),
            provision=_flag(env, "PROVISION", base.provision),
            burst=_flag(env, "BURST", False),
            tune_gc=_flag(env, "TUNE_GC", True),
            start_timeout_s=base.connect_timeout_s,
        )


def _key(name: str) -> str:
    return f"TOKENWIRE_ASSEMBLER_{name}"


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    return config.parse_int(_key(name), env.get(_key(name), str(default)), 1)


def _flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(_key(name), "1" if default else "0").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ConfigError(_key(name), raw, "expected 1 or 0")


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(_key(name), str(default))
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(_key(name), raw, "expected seconds") from None
    if value <= 0:
        raise ConfigError(_key(name), raw, "expected a positive number of seconds")
    return value


def _assembly_config(env: Mapping[str, str]) -> AssemblyConfig:
    return AssemblyConfig(
        max_open_steps=_int(env, "MAX_OPEN_STEPS", 20_000),
        gap_timeout_s=_seconds(env, "GAP_TIMEOUT_S", 30.0),
        abandon_timeout_s=_seconds(env, "ABANDON_TIMEOUT_S", 120.0),
    )


def _metrics_addr(env: Mapping[str, str]) -> tuple[str, int] | None:
    raw = env.get(_key("METRICS_ADDR"), DEFAULT_METRICS_ADDR)
    if raw.lower() in ("off", "none", ""):
        return None
    try:
        return config.parse_addr(raw)
    except ConfigError as exc:
        raise ConfigError(_key("METRICS_ADDR"), raw, exc.why) from None
