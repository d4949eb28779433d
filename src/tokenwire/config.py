"""Settings shared by every command, from the environment (each also a flag of the CLI).

| variable | default |
| --- | --- |
| ``TOKENWIRE_NATS_URL`` | absent: ``demo``/``up`` start the embedded server |
| ``TOKENWIRE_STORE`` | ``sqlite:///<data dir>/store.db`` |
| ``TOKENWIRE_DATA_DIR`` | ``./.tokenwire`` |
| ``TOKENWIRE_GATEWAY_KEYS`` | absent: the gateway listens on loopback only |
| ``TOKENWIRE_GATEWAY_ADDR`` | ``127.0.0.1:8080`` |
| ``TOKENWIRE_PARTITIONS`` | ``16`` |
| ``TOKENWIRE_SHARDS`` | ``1``: chunk streams, each owning a contiguous range of partitions |
| ``TOKENWIRE_SHARD_TAGS`` | absent: JetStream places the shards; else tag ``k mod n`` per shard |
| ``TOKENWIRE_REGISTRY_SHARDS`` | ``1``: step-registry KV buckets, by session; fixed once deployed |
| ``TOKENWIRE_REPLICAS`` | ``1`` (3 in a three-node cluster) |
| ``TOKENWIRE_RETENTION_BYTES`` | ``4GiB``: the chunk streams' byte budget, split over the shards |
| ``TOKENWIRE_RETENTION_AGE_S`` | ``604800`` (7 days): the oldest chunk kept |
| ``TOKENWIRE_COMPRESSION`` | ``s2``: the chunk streams' compression (``s2`` or ``none``) |
| ``TOKENWIRE_PROVISION`` | ``1``: services create/update the topology at start; ``0``: they don't |
| ``TOKENWIRE_CONNECT_TIMEOUT_S`` | ``5``: bound of the first connect to broker and store |

The table of every variable, its flag and its commands is :mod:`tokenwire.variables`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DATA_DIR = "./.tokenwire"
DEFAULT_GATEWAY_ADDR = "127.0.0.1:8080"
NATS_URL_FILE = "nats.url"
DEFAULT_CONNECT_TIMEOUT_S = 5.0
"""How long a command's (or a service's) first connect to the broker or the store may take."""

DEFAULT_RETENTION_BYTES = 4 * 1024**3
DEFAULT_RETENTION_AGE_S = 7 * 24 * 3600.0
DEFAULT_COMPRESSION = "s2"
"""Chosen by measurement (docs/adr/0023-shards-compression-retention-budget.md)."""
COMPRESSIONS = ("s2", "none")
MAX_REGISTRY_SHARDS = 64
"""The most step-registry buckets (``TOKENWIRE_REGISTRY_SHARDS``): 64 buckets at half a core
each carry ~2.4M registry writes/s (docs/capacity.md), far past any fleet measured here."""
_BYTE_UNITS = {"": 1, "B": 1, "KIB": 1024, "MIB": 1024**2, "GIB": 1024**3, "TIB": 1024**4,
               "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4}  # fmt: skip
_BYTES = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*")
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/\s,]*@")


class ConfigError(ValueError):
    """A setting is malformed. ``name`` is the variable or flag, ``value`` what was given."""

    def __init__(self, name: str, value: str, why: str) -> None:
        super().__init__(f"{name}={value!r}: {why}")
        self.name = name
        self.value = value
        self.why = why


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
    replicas: int = 1
    provision: bool = True
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    shards: int = 1
    shard_tags: tuple[str, ...] = ()
    retention_bytes: int = DEFAULT_RETENTION_BYTES
    retention_age_s: float = DEFAULT_RETENTION_AGE_S
    compression: str = DEFAULT_COMPRESSION
    registry_shards: int = 1

    @property
    def nats_url(self) -> str | None:
        """The server URLs joined as nats-py accepts them, or None when none is configured."""
        return ",".join(self.nats_urls) or None

    def recorded_nats_url(self) -> str | None:
        """The URL that ``demo``/``up`` recorded in the data directory, if any."""
        path = self.data_dir / NATS_URL_FILE
        return path.read_text().strip() or None if path.is_file() else None


def load(env: Mapping[str, str] | None = None) -> Settings:
    """Read the settings from ``env`` (default: the process environment)."""
    env = os.environ if env is None else env
    data_dir = Path(env.get("TOKENWIRE_DATA_DIR", DEFAULT_DATA_DIR))
    partitions = parse_int("TOKENWIRE_PARTITIONS", env.get("TOKENWIRE_PARTITIONS", "16"), 1)
    host, port = parse_addr(env.get("TOKENWIRE_GATEWAY_ADDR", DEFAULT_GATEWAY_ADDR))
    return Settings(
        data_dir=data_dir,
        nats_urls=parse_urls(env.get("TOKENWIRE_NATS_URL", "")),
        store_url=env.get("TOKENWIRE_STORE") or f"sqlite:///{data_dir / 'store.db'}",
        gateway_host=host,
        gateway_port=port,
        gateway_keys=frozenset(k for k in env.get("TOKENWIRE_GATEWAY_KEYS", "").split(",") if k),
        partitions=partitions,
        replicas=parse_int("TOKENWIRE_REPLICAS", env.get("TOKENWIRE_REPLICAS", "1"), 1, 5),
        provision=parse_flag("TOKENWIRE_PROVISION", env.get("TOKENWIRE_PROVISION", "1")),
        connect_timeout_s=connect_timeout(env),
        shards=parse_int("TOKENWIRE_SHARDS", env.get("TOKENWIRE_SHARDS", "1"), 1, partitions),
        shard_tags=tuple(t.strip() for t in env.get("TOKENWIRE_SHARD_TAGS", "").split(",")
                         if t.strip()),
        retention_bytes=parse_bytes("TOKENWIRE_RETENTION_BYTES",
                                    env.get("TOKENWIRE_RETENTION_BYTES", "4GiB")),
        retention_age_s=parse_seconds("TOKENWIRE_RETENTION_AGE_S",
                                      env.get("TOKENWIRE_RETENTION_AGE_S", "604800")),
        compression=parse_choice("TOKENWIRE_COMPRESSION", env.get("TOKENWIRE_COMPRESSION",
                                 DEFAULT_COMPRESSION), COMPRESSIONS),
        registry_shards=parse_int("TOKENWIRE_REGISTRY_SHARDS",
                                  env.get("TOKENWIRE_REGISTRY_SHARDS", "1"), 1,
                                  MAX_REGISTRY_SHARDS),
    )  # fmt: skip


def parse_bytes(name: str, value: str) -> int:
    """A positive byte count: ``4294967296``, ``4GiB``, ``512MiB``, ``10GB`` (binary and
    decimal units, case-insensitive)."""
    match = _BYTES.fullmatch(value)
    unit = _BYTE_UNITS.get(match.group(2).upper()) if match else None
    if match is None or unit is None or int(match.group(1)) <= 0:
        raise ConfigError(name, value, "expected a positive size such as 4GiB or 512MiB")
    return int(match.group(1)) * unit


def parse_choice(name: str, value: str, choices: tuple[str, ...]) -> str:
    """One of ``choices`` (case-insensitive)."""
    lowered = value.strip().lower()
    if lowered not in choices:
        raise ConfigError(name, value, f"expected one of {', '.join(choices)}")
    return lowered


def connect_timeout(env: Mapping[str, str] | None = None) -> float:
    """``TOKENWIRE_CONNECT_TIMEOUT_S`` (default :data:`DEFAULT_CONNECT_TIMEOUT_S`)."""
    env = os.environ if env is None else env
    raw = env.get("TOKENWIRE_CONNECT_TIMEOUT_S", str(DEFAULT_CONNECT_TIMEOUT_S))
    return parse_seconds("TOKENWIRE_CONNECT_TIMEOUT_S", raw)


def parse_seconds(name: str, value: str) -> float:
    """A positive, finite number of seconds."""
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigError(name, value, "expected seconds") from None
    if not 0 < seconds < float("inf"):
        raise ConfigError(name, value, "expected a positive number of seconds")
    return seconds


def without_userinfo(text: str) -> str:
    """``text`` with every URL's ``user:password@`` removed (``nats://u:p@h:4222`` ->
    ``nats://h:4222``): what a message may say about where it tried to connect."""
    return _USERINFO.sub(r"\g<scheme>", text)


def parse_urls(value: str) -> tuple[str, ...]:
    """Comma-separated NATS URLs; each must be ``nats://``, ``tls://``, ``ws://`` or ``wss://``."""
    urls = tuple(u.strip() for u in value.split(",") if u.strip())
    for url in urls:
        if not url.startswith(("nats://", "tls://", "ws://", "wss://")):
            raise ConfigError("TOKENWIRE_NATS_URL", url, "expected nats://HOST:PORT")
    return urls


def parse_addr(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ConfigError("TOKENWIRE_GATEWAY_ADDR", value, "expected HOST:PORT")
    return host.strip("[]"), parse_int("TOKENWIRE_GATEWAY_ADDR", port, 0, 65535)


def parse_flag(name: str, value: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off``."""
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(name, value, "expected 1 or 0")


def parse_int(name: str, value: str, low: int, high: int | None = None) -> int:
    """An integer within ``[low, high]``."""
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(name, value, "expected an integer") from None
    if number < low or (high is not None and number > high):
        raise ConfigError(name, value, f"expected {low}..{high if high is not None else ''}")
    return number
