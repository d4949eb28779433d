"""One chunk stream's ceiling, and K of them, on a loopback three-node cluster at R3.

A stream is one raft group: its leader node stores, replicates and acks every chunk, its two
followers store them. This measures, for K = 1 and K = 3 shards (leaders spread by
provisioning), the acked publish rate of one client process and every node's CPU per chunk
(``/proc`` user + system of each nats-server, from the first publish to 1 s after the last
ack). The load is the recorded provider streams of ``bench_compression`` (real envelopes,
``Nats-Msg-Id`` headers, S2 on, as deployed).

What it can and cannot say on a 2-core machine: three servers and the client share two
cores, so the acked rate is the machine's, not a stream's. The per-chunk CPU is not: with
K = 1 the leader node's CPU per chunk bounds one stream at ``1e6 / leader_us`` chunks/s on a
core of its own (its raft and disk work for the stream runs on the leader), and K shards with
leaders on different nodes put that work on K nodes. Run: ``python -m bench shards`` (records
phase ``shards``) or ``python -m bench.bench_shards`` (JSON).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections import Counter
from pathlib import Path

from bench.bench_compression import cpu_s, envelopes
from tokenwire.broker import (
    ChunkPublisher,
    EmbeddedCluster,
    Topology,
    TopologyError,
    connect,
    ensure_topology,
    shard_leaders,
)

CHUNKS = 100_000
FIGURES: dict[str, float] = {}
_READY_S = 60.0


async def _provision(urls: list[str], t: Topology) -> None:
    nc = await connect(urls)
    deadline = time.monotonic() + _READY_S
    try:
        while True:
            try:
                await ensure_topology(nc, t)
                return
            except TopologyError:  # no meta leader yet
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.5)
    finally:
        await nc.close()


async def run_layout(cluster: EmbeddedCluster, shards: int, chunks: int) -> dict[str, object]:
    t = Topology(prefix=f"k{shards}", stream=f"SH{shards}", events_stream=f"SHE{shards}",
                 dlq_stream=f"SHD{shards}", steps_bucket=f"shs-{shards}", partitions=12,
                 shards=shards, replicas=3, max_bytes=1024**3)  # fmt: skip
    await _provision(cluster.urls, t)
    load = envelopes(chunks)
    nc = await connect(cluster.urls)
    try:
        leaders = await shard_leaders(nc, t)
        publisher = await ChunkPublisher(nc, t).start()
        pids = {s.name: s.pid for s in cluster.servers}
        cpu0, started = {n: cpu_s(p) for n, p in pids.items()}, time.perf_counter()
        for session, step, ordinal, payload in load:
            await publisher.publish(payload, session, 0, step, ordinal, first=ordinal == 0)
        await publisher.flush(300.0)
        rate = len(load) / (time.perf_counter() - started)
        await asyncio.sleep(1.0)
        cpu = {n: (cpu_s(p) - cpu0[n]) * 1e6 / len(load) for n, p in pids.items()}
        await publisher.close()
    finally:
        await nc.close()
    led = Counter(leaders.values())
    return {
        "shards": shards,
        "acked_chunks_per_s": round(rate),
        "leaders": dict(led),
        "cpu_us_per_chunk_by_node": {n: round(v, 2) for n, v in sorted(cpu.items())},
        "cpu_us_per_chunk_all_nodes": round(sum(cpu.values()), 2),
        "leader_node_cpu_us_per_chunk": round(max(cpu[n] for n in led), 2),
    }


async def measure(chunks: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = EmbeddedCluster(Path(tmp)).start()
        try:
            one = await run_layout(cluster, 1, chunks)
            three = await run_layout(cluster, 3, chunks)
        finally:
            cluster.stop()
    leader_us = float(one["leader_node_cpu_us_per_chunk"])  # type: ignore[arg-type]
    return {"chunks": chunks, "k1": one, "k3": three,
            "one_stream_ceiling_chunks_per_s_per_leader_core": round(1e6 / leader_us)}  # fmt: skip


def main() -> str:
    """The suite's entry (``python -m bench shards``): the table; FIGURES filled."""
    result = asyncio.run(measure(CHUNKS))
    rows = []
    for key in ("k1", "k3"):
        r = result[key]
        assert isinstance(r, dict)
        FIGURES[f"{key}_acked_chunks_per_s"] = float(r["acked_chunks_per_s"])
        FIGURES[f"{key}_cpu_us_per_chunk_all_nodes"] = float(r["cpu_us_per_chunk_all_nodes"])
        FIGURES[f"{key}_leader_node_cpu_us_per_chunk"] = float(r["leader_node_cpu_us_per_chunk"])
        by_node = ", ".join(f"{n} {v}" for n, v in r["cpu_us_per_chunk_by_node"].items())
        rows.append(f"| {r['shards']} | {r['leaders']} | {r['acked_chunks_per_s']:,} | "
                    f"{by_node} | {r['cpu_us_per_chunk_all_nodes']} |")  # fmt: skip
    ceiling = result["one_stream_ceiling_chunks_per_s_per_leader_core"]
    assert isinstance(ceiling, int)
    FIGURES["one_stream_ceiling_chunks_per_s"] = float(ceiling)
    return "\n".join([
        f"{CHUNKS:,} recorded-stream chunks per layout, three nats-servers on loopback, R3, S2",
        "",
        "| shards | leaders per node | acked chunks/s (one client) | CPU us/chunk by node "
        "| CPU us/chunk, all nodes |",
        "| ---: | --- | ---: | --- | ---: |",
        *rows,
        "",
        f"one stream's ceiling, its leader on a core of its own: ~{ceiling:,} chunks/s",
    ])  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(asyncio.run(measure(CHUNKS)), indent=2))
