"""How a variable's text becomes its value: the parsers of :mod:`tokenwire.variables`' rows,
each ``(variable name, text) -> value`` or :class:`ConfigError` naming the variable."""

from __future__ import annotations

import math
import re
from collections.abc import Callable

COMPRESSIONS = ("s2", "none")
MAX_REGISTRY_SHARDS = 64
"""The most step-registry buckets (``TOKENWIRE_REGISTRY_SHARDS``): 64 buckets at half a core
each carry ~2.4M registry writes/s (docs/capacity.md), far past any fleet measured here."""
MAX_LINGER_MS = 1000
"""The largest frame linger accepted: a frame is at most this late on the broker (tail,
viewer, assembler), and a gateway that dies loses at most this much of a step it was
streaming."""
MAX_COALESCE_MS = 1000
"""The longest coalescing wait (``TOKENWIRE_GATEWAY_COALESCE_MS``, a request's
``x-tokenwire-coalesce-ms``): at most a second between reads, well inside a step's idle
bound."""


class ConfigError(ValueError):
    """A setting is malformed. ``name`` is the variable or flag, ``value`` what was given."""

    def __init__(self, name: str, value: str, why: str) -> None:
        super().__init__(f"{name}={value!r}: {why}")
        self.name = name
        self.value = value
        self.why = why


_BYTE_UNITS = {
    "": 1,
    "B": 1,
    "KIB": 1024,
    "MIB": 1024**2,
    "GIB": 1024**3,
    "TIB": 1024**4,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
}
_BYTES = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def parse_int(name: str, value: str, low: int, high: int | None = None) -> int:
    """An integer within ``[low, high]``."""
    try:
        number = int(value)
    except ValueError:
        raise ConfigError(name, value, "expected an integer") from None
    if number < low or (high is not None and number > high):
        raise ConfigError(name, value, f"expected {low}..{high if high is not None else ''}")
    return number


def integer(low: int, high: int | None = None) -> Callable[[str, str], int]:
    """The parser of an integer within ``[low, high]``."""

    def parse(name: str, value: str) -> int:
        return parse_int(name, value, low, high)

    return parse


def parse_seconds(name: str, value: str) -> float:
    """A positive, finite number of seconds."""
    try:
        seconds = float(value)
    except ValueError:
        raise ConfigError(name, value, "expected seconds") from None
    if not 0 < seconds < math.inf:
        raise ConfigError(name, value, "expected a positive number of seconds")
    return seconds


def seconds_at_least(low: float) -> Callable[[str, str], float]:
    """The parser of a number of seconds of at least ``low``."""

    def parse(name: str, value: str) -> float:
        seconds = parse_seconds(name, value)
        if seconds < low:
            raise ConfigError(name, value, f"expected at least {low:g} seconds")
        return seconds

    return parse


def parse_bytes(name: str, value: str) -> int:
    """A positive byte count: ``4294967296``, ``4GiB``, ``512MiB``, ``10GB`` (binary and
    decimal units, case-insensitive)."""
    match = _BYTES.fullmatch(value)
    unit = _BYTE_UNITS.get(match.group(2).upper()) if match else None
    if match is None or unit is None or int(match.group(1)) <= 0:
        raise ConfigError(name, value, "expected a positive size such as 4GiB or 512MiB")
    return int(match.group(1)) * unit


def parse_flag(name: str, value: str) -> bool:
    """``1/true/yes/on`` or ``0/false/no/off`` (case-insensitive)."""
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(name, value, "expected true or false (1 or 0)")


def optional_flag(name: str, value: str) -> bool | None:
    """A flag, or None when empty (the row says what that means)."""
    return parse_flag(name, value) if value.strip() else None


def choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    """The parser of one of ``choices`` (case-insensitive)."""

    def parse(name: str, value: str) -> str:
        lowered = value.strip().lower()
        if lowered not in choices:
            raise ConfigError(name, value, f"expected one of {', '.join(choices)}")
        return lowered

    return parse


def parse_addr(name: str, value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ConfigError(name, value, "expected HOST:PORT")
    return host.strip("[]"), parse_int(name, port, 0, 65535)


def optional_addr(name: str, value: str) -> tuple[str, int] | None:
    """``HOST:PORT``, or None for ``off`` (``none`` and empty too)."""
    return None if value.strip().lower() in ("off", "none", "") else parse_addr(name, value)


def nats_urls(name: str, value: str) -> tuple[str, ...]:
    """Comma-separated NATS URLs; each ``nats://``, ``tls://``, ``ws://`` or ``wss://``."""
    urls = tuple(u.strip() for u in value.split(",") if u.strip())
    for url in urls:
        if not url.startswith(("nats://", "tls://", "ws://", "wss://")):
            raise ConfigError(name, url, "expected nats://HOST:PORT")
    return urls


def names(name: str, value: str) -> tuple[str, ...]:
    """Comma-separated names, each stripped; empty ones dropped."""
    return tuple(n.strip() for n in value.split(",") if n.strip())


def key_list(name: str, value: str) -> frozenset[str]:
    """Comma-separated keys, each stripped; empty ones dropped."""
    return frozenset(names(name, value))


def text(name: str, value: str) -> str:
    """The text as given."""
    return value
