"""Loopback ports for the servers a stack or a test starts: free now, and handed out once.

A port from ``bind(0)`` is the kernel's ephemeral range, where any outgoing connection or
port-0 listener may take it between the check and the server's own bind: the server then
fails, while another answers on its address. :func:`free_port` picks below that range and
leases each port it hands out for ``LEASE_S`` with a marker file, so concurrent callers on one
machine (pytest workers, ``tokenwire up``) never get the same port (docs/adr/0038).
"""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time
from pathlib import Path

LEASE_S = 300.0
_TRIES = 256
_POOL_SIZE = 12_288  # ports just below the ephemeral range
_RESERVED_PORTS = frozenset({4222, 6222, 8222})  # a system NATS may already own these
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port() -> int:
    """A loopback TCP port that is free now and that no other caller got in the last
    ``LEASE_S`` seconds; a kernel-chosen one where no range outside the ephemeral one exists."""
    pool = _pool()
    leases = _lease_dir()
    for _ in range(_TRIES if pool else 1):
        port = random.choice(pool) if pool else _kernel_port()
        if port not in _RESERVED_PORTS and _bindable(port) and _lease(leases, port):
            return port
    return _kernel_port()


def _pool() -> range:
    """The ports below the kernel's ephemeral range (or above it), else none."""
    try:
        low, high = (int(part) for part in _EPHEMERAL.read_text().split())
    except (OSError, ValueError):
        return range(0)
    if low - _POOL_SIZE >= 1024:
        return range(low - _POOL_SIZE, low)
    if high + _POOL_SIZE <= 65535:
        return range(high + 1, high + 1 + _POOL_SIZE)
    return range(0)


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _kernel_port() -> int:
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in _RESERVED_PORTS:
            return port


def _lease_dir() -> Path | None:
    path = Path(tempfile.gettempdir()) / f"tokenwire-ports-{os.getuid()}"
    try:
        path.mkdir(mode=0o700, exist_ok=True)
    except OSError:
        return None
    return path


def _lease(leases: Path | None, port: int) -> bool:
    """True when this caller now holds ``port``'s lease (or no lease can be kept here)."""
    if leases is None:
        return True
    marker = leases / str(port)
    try:
        if time.time() - marker.stat().st_mtime < LEASE_S:
            return False
        marker.unlink()  # an expired lease
    except FileNotFoundError:
        pass
    except OSError:
        return True
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    except FileExistsError:
        return False  # another caller took it just now
    except OSError:
        return True
    return True
