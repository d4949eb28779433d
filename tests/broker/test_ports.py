"""free_port: a bindable loopback port outside the kernel's ephemeral range, handed out once
per lease across processes (a port-0 listener or an outgoing connection cannot take it)."""

from __future__ import annotations

import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tokenwire.broker import _ports, free_port


def _ephemeral() -> tuple[int, int]:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


def test_a_port_is_bindable_and_outside_the_ephemeral_range() -> None:
    low, high = _ephemeral()
    port = free_port()
    assert not low <= port <= high
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # raises when it is taken


def test_a_leased_port_is_not_handed_out_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_ports, "_lease_dir", lambda: tmp_path)
    picks = iter([30_001, 30_001, 30_002])
    monkeypatch.setattr(_ports, "_pool", lambda: range(30_000, 30_010))
    monkeypatch.setattr(random, "choice", lambda _pool: next(picks))
    assert [free_port(), free_port()] == [30_001, 30_002]


def test_an_expired_lease_is_taken_over(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(_ports, "_lease_dir", lambda: tmp_path)
    monkeypatch.setattr(_ports, "_pool", lambda: range(30_001, 30_002))
    monkeypatch.setattr(_ports, "LEASE_S", 0.0)
    assert [free_port(), free_port()] == [30_001, 30_001]


def test_a_taken_port_is_skipped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(_ports, "_lease_dir", lambda: tmp_path)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        held.listen()
        picks = iter([taken, 30_003])
        monkeypatch.setattr(_ports, "_pool", lambda: range(30_000, 30_010))
        monkeypatch.setattr(random, "choice", lambda _pool: next(picks))
        assert free_port() == 30_003


def test_processes_asking_at_once_get_distinct_ports() -> None:
    code = "from tokenwire.broker import free_port; print(*(free_port() for _ in range(200)))"
    argv = [sys.executable, "-c", code]
    runs = [subprocess.Popen(argv, stdout=subprocess.PIPE) for _ in range(3)]
    ports = [int(p) for run in runs for p in run.communicate(timeout=60)[0].split()]
    assert all(run.returncode == 0 for run in runs)
    assert len(ports) == len(set(ports)) == 600
