"""No secret anywhere: the test's sentinel secrets searched for in everything a run leaves.

Logs of every process (services and nats-server nodes), the broker's messages with their
headers (chunk, events and dead-letter streams, read raw), the store (the SQLite file and its
WAL, byte for byte, or a PostgreSQL dump of the rows) and every HTTP answer the callers got.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from nats.aio.client import Client
from nats.js.api import ConsumerConfig

from tests.deploy._nats import PASSWORDS
from tests.faults._services import SENTINELS
from tokenwire.broker import Topology, ordered_subscribe

ALL_SENTINELS = (*SENTINELS, *PASSWORDS.values())


def leaks(blobs: Iterable[tuple[str, bytes]]) -> list[str]:
    """``where: sentinel`` for every sentinel found in a named blob."""
    found = []
    for where, blob in blobs:
        for secret in ALL_SENTINELS:
            if secret.encode() in blob:
                found.append(f"{where}: {secret}")
    return found


def files(paths: Iterable[Path]) -> list[tuple[str, bytes]]:
    return [(str(p), p.read_bytes()) for p in paths if p.exists()]


async def broker_messages(operator: Client, topology: Topology) -> list[tuple[str, bytes]]:
    """Every message of the chunk, events and dead-letter streams, payload and headers
    (bounded by their counts)."""
    js = operator.jetstream()
    out: list[tuple[str, bytes]] = []
    for stream, subject in (
        *((s, f"{topology.prefix}.chunks.>") for s in topology.chunk_streams),
        *((s, f"{topology.prefix}.events.>") for s in topology.events_streams),
        (topology.dlq_stream, f"{topology.prefix}.dlq.>"),
    ):
        total = (await js.stream_info(stream)).state.messages
        if not total:
            continue
        sub = await ordered_subscribe(js, subject, stream=stream, config=ConsumerConfig())
        try:
            for _ in range(total):
                msg = await sub.next_msg(timeout=10)
                headers = "".join(f"{k}: {v}\n" for k, v in (msg.headers or {}).items())
                out.append((f"{stream} {msg.subject}", headers.encode() + msg.data))
        finally:
            await sub.unsubscribe()
    return out
