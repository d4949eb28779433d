"""Settings shared by every command, from the environment (each also a flag of the CLI).

:func:`load` reads the shared rows of the catalogue (:mod:`tokenwire.variables`: each
variable's parser and default, stated once) into :class:`Settings`; a service reads them
through it once and its own rows beside it. The parsers and :class:`ConfigError` live in the
catalogue and are re-exported here.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tokenwire.variables import (
    COMPRESSION,
    COMPRESSIONS,
    CONNECT_TIMEOUT_S,
    DATA_DIR,
    GATEWAY_ADDR,
    GATEWAY_KEYS,
    MAX_REGISTRY_SHARDS,
    NATS_URL,
    PARTITIONS,
    PROVISION,
    REGISTRY_SHARDS,
    REPLICAS,
    RETENTION_AGE_S,
    RETENTION_BYTES,
    SHARD_TAGS,
    SHARDS,
    STOP_TIMEOUT_S,
    STORE,
    ConfigError,
    parse_addr,
    parse_bytes,
    parse_flag,
    parse_int,
    parse_seconds,
)

NATS_URL_FILE = "nats.url"
DEFAULT_CONNECT_TIMEOUT_S = CONNECT_TIMEOUT_S.value
"""How long a command's (or a service's) first connect to the broker or the store may take."""
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s,]*@")


@dataclass(frozen=True)
class Settings:
    """Resolved settings. Build with :func:`load`; override fields with ``dataclasses.replace``."""

    data_dir: Path
    nats_urls: tuple[str, ...]
    store_url: str
    gateway_host: str
    gateway_port: int
    gateway_keys: frozenset[str]
    partitions: int
    replicas: int = REPLICAS.value
    provision: bool = PROVISION.value
    connect_timeout_s: float = CONNECT_TIMEOUT_S.value
    shards: int = SHARDS.value
    shard_tags: tuple[str, ...] = SHARD_TAGS.value
    retention_bytes: int = RETENTION_BYTES.value
    retention_age_s: float = RETENTION_AGE_S.value
    compression: str = COMPRESSION.value
    registry_shards: int = REGISTRY_SHARDS.value

    @property
    def nats_url(self) -> str | None:
        """The server URLs joined as nats-py accepts them, or None when none is configured."""
        return ",".join(self.nats_urls) or None

    def recorded_nats_url(self) -> str | None:
        """The URL that ``demo``/``up`` recorded in the data directory, if any."""
        path = self.data_dir / NATS_URL_FILE
        return path.read_text().strip() or None if path.is_file() else None


def load(env: Mapping[str, str] | None = None) -> Settings:
    """Read the shared settings from ``env`` (default: the process environment)."""
    env = os.environ if env is None else env
    data_dir = Path(DATA_DIR.read(env))
    partitions = PARTITIONS.read(env)
    shards = SHARDS.read(env)
    if shards > partitions:
        raise ConfigError(SHARDS.env, str(shards), f"expected 1..{partitions}")
    host, port = GATEWAY_ADDR.read(env)
    return Settings(
        data_dir=data_dir,
        nats_urls=NATS_URL.read(env),
        store_url=STORE.read(env) or f"sqlite:///{data_dir / 'store.db'}",
        gateway_host=host,
        gateway_port=port,
        gateway_keys=GATEWAY_KEYS.read(env),
        partitions=partitions,
        replicas=REPLICAS.read(env),
        provision=PROVISION.read(env),
        connect_timeout_s=CONNECT_TIMEOUT_S.read(env),
        shards=shards,
        shard_tags=SHARD_TAGS.read(env),
        retention_bytes=RETENTION_BYTES.read(env),
        retention_age_s=RETENTION_AGE_S.read(env),
        compression=COMPRESSION.read(env),
        registry_shards=REGISTRY_SHARDS.read(env),
    )


def connect_timeout(env: Mapping[str, str] | None = None) -> float:
    """``TOKENWIRE_CONNECT_TIMEOUT_S`` alone (default: the process environment)."""
    return CONNECT_TIMEOUT_S.read(os.environ if env is None else env)


def stop_timeout(env: Mapping[str, str] | None = None) -> float:
    """``TOKENWIRE_STOP_TIMEOUT_S`` alone (default: the process environment): how long a
    process takes at most to exit after SIGINT/SIGTERM."""
    return STOP_TIMEOUT_S.read(os.environ if env is None else env)


def without_userinfo(text: str) -> str:
    """``text`` with every URL's ``user:password@`` removed (``nats://u:p@h:4222`` ->
    ``nats://h:4222``): what a message may say about where it tried to connect."""
    return _USERINFO.sub(r"\g<scheme>", text)


__all__ = [
    "COMPRESSIONS",
    "DEFAULT_CONNECT_TIMEOUT_S",
    "MAX_REGISTRY_SHARDS",
    "NATS_URL_FILE",
    "ConfigError",
    "Settings",
    "connect_timeout",
    "load",
    "parse_addr",
    "parse_bytes",
    "parse_flag",
    "parse_int",
    "parse_seconds",
    "without_userinfo",
]
