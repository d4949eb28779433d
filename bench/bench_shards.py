"""One chunk stream's ceiling, and K of them, on a loopback three-node cluster at R3; the
step registry's writes on the same cluster; a single server for the R3 / R1 ratio.

A stream is one raft group: its leader node stores, replicates and acks every message, its
two followers store them. This measures, per layout, the acked publish rate of one client
process and every node's CPU per message and per chunk (``/proc`` user + system of each
nats-server, from the first publish to 1 s after the last ack). The load is the recorded
provider streams of ``bench_compression`` (real chunks, ``Nats-Msg-Id`` headers, S2 on, as
deployed), published two ways:

- ``v1``: one message per chunk (frames off, the wire before ADR 0024);
- ``frames``: as the gateway frames a step at 50 tokens/s with the 200 ms linger: the first
  chunk alone, the last (the finish) alone, the others in frames of :data:`PER_FRAME`
  (the paced bench measures ~10 chunks per frame at that pace).

Layouts: K = 1 v1, K = 1 frames, K = 3 frames (leaders spread by provisioning), all R3 on
the cluster; then :data:`STEPS` step assignments through the real ``StepRegistry`` (the
gateway's claim per step: a pointer compare-and-set and a claim create) on the R3 bucket;
then the K = 1 frames load on one single server (R1), which gives the cluster's work per
message over a single server's (the R3 / R1 ratio the capacity model applies).

What it can and cannot say on a 2-core machine: three servers and the client share two
cores, so the acked rate is the machine's, not a stream's. The per-message CPU is not: the
leader node's CPU per message bounds one stream at ``1e6 / leader_us`` messages/s on a core
of its own (its raft and disk work for the stream runs on the leader), and K shards with
leaders on different nodes put that work on K nodes. Run: ``python -m bench shards``
(records phase ``shards``) or ``python -m bench.bench_shards`` (JSON).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

from bench.bench_compression import cpu_s, disk_bytes, envelopes, recorded_steps
from tokenwire.broker import (
    ChunkPublisher,
    EmbeddedCluster,
    EmbeddedServer,
    StepRegistry,
    Topology,
    TopologyError,
    connect,
    ensure_topology,
    shard_leaders,
)
from tokenwire.schemas import FRAME_TAIL, frame_head, frame_item

CHUNKS = 100_000
PER_FRAME = 10
STEPS = 10_000
FIGURES: dict[str, float] = {}
_READY_S = 60.0
_STEP_SESSIONS = 500

Load = list[tuple[str, int, bytes, int]]
"""(session, first ordinal, payload, chunks in it) per message, step 0 of each session."""


def v1_load(chunks: int) -> Load:
    """One v1 envelope per chunk (frames off)."""
    return [(session, ordinal, payload, 1) for session, _, ordinal, payload in envelopes(chunks)]


def framed_load(chunks: int, per_frame: int = PER_FRAME) -> Load:
    """The recorded steps cycled as the gateway frames them at 50 tokens/s: ordinal 0 alone,
    the last chunk alone, the others ``per_frame`` to a frame; 20 ms between chunks."""
    steps, out, total, i = recorded_steps(), [], 0, 0
    now = time.time_ns()
    while total < chunks:
        provider, step = steps[i % len(steps)]
        session, i = str(uuid.uuid4()), i + 1
        n = len(step)
        cuts = [0, *range(1, max(1, n - 1), per_frame), *([n - 1] if n > 1 else []), n]
        for a, b in itertools.pairwise(cuts):
            if a >= b:
                continue
            first = now if a == 0 else None
            head = frame_head(
                session=session,
                turn=0,
                step=0,
                ordinal=a,
                time_ns=now + a * 20_000_000,
                provider=provider,
                model=f"{provider}-model",
                request_time_ns=first,
            )
            items = b",".join(frame_item((k - a) * 20_000_000, step[k]) for k in range(a, b))
            out.append((session, a, head + items + FRAME_TAIL, b - a))
            total += b - a
    return out


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


def _topology(name: str, shards: int, replicas: int) -> Topology:
    return Topology(
        prefix=name.lower(),
        stream=f"SH_{name}",
        events_stream=f"SHE_{name}",
        dlq_stream=f"SHD_{name}",
        steps_bucket=f"shs-{name.lower()}",
        partitions=12,
        shards=shards,
        replicas=replicas,
        max_bytes=1024**3,
    )


async def run_layout(
    urls: list[str], pids: dict[str, int], t: Topology, load: Load
) -> dict[str, object]:
    """Publish ``load`` to the provisioned layout ``t``; rate and CPU per message and chunk."""
    await _provision(urls, t)
    nc = await connect(urls)
    try:
        leaders = await shard_leaders(nc, t) if t.replicas > 1 else {}
        publisher = await ChunkPublisher(nc, t).start()
        cpu0, started = {n: cpu_s(p) for n, p in pids.items()}, time.perf_counter()
        for session, ordinal, payload, _ in load:
            await publisher.publish(payload, session, 0, 0, ordinal, first=ordinal == 0)
        await publisher.flush(300.0)
        rate = len(load) / (time.perf_counter() - started)
        await asyncio.sleep(1.0)
        cpu = {n: (cpu_s(p) - cpu0[n]) * 1e6 for n, p in pids.items()}
        await publisher.close()
    finally:
        await nc.close()
    chunks = sum(c for *_, c in load)
    led = Counter(leaders.values())
    leader_node = max(led, key=lambda n: cpu[n]) if led else next(iter(pids))
    return {
        "shards": t.shards,
        "replicas": t.replicas,
        "messages": len(load),
        "chunks": chunks,
        "messages_per_chunk": round(len(load) / chunks, 4),
        "acked_messages_per_s": round(rate),
        "acked_chunks_per_s": round(rate * chunks / len(load)),
        "leaders": dict(led),
        "cpu_us_per_chunk_by_node": {n: round(v / chunks, 2) for n, v in sorted(cpu.items())},
        "cpu_us_per_message_by_node": {n: round(v / len(load), 2) for n, v in sorted(cpu.items())},
        "cpu_us_per_chunk_all_nodes": round(sum(cpu.values()) / chunks, 2),
        "cpu_us_per_message_all_nodes": round(sum(cpu.values()) / len(load), 2),
        "leader_node_cpu_us_per_chunk": round(cpu[leader_node] / chunks, 2),
        "leader_node_cpu_us_per_message": round(cpu[leader_node] / len(load), 2),
    }


async def _accounted(url: str, stream: str) -> int:
    nc = await connect(url)
    try:
        return int((await nc.jetstream().stream_info(stream)).state.bytes)
    finally:
        await nc.close()


async def run_consume(urls: list[str], pids: dict[str, int], t: Topology) -> dict[str, object]:
    """One durable pull consumer (the assembler's kind: explicit ack, batches of 256) reads
    and acks every message of ``t``'s first stream; CPU per message by node."""
    nc = await connect(urls)
    try:
        js = nc.jetstream()
        stream = t.chunk_streams[0]
        total = (await js.stream_info(stream)).state.messages
        sub = await js.pull_subscribe(f"{t.prefix}.chunks.>", durable="bench-reader", stream=stream)
        cpu0, started, got = {n: cpu_s(p) for n, p in pids.items()}, time.perf_counter(), 0
        while got < total:
            for msg in await sub.fetch(256, timeout=30):
                await msg.ack()
                got += 1
        await nc.flush()
        rate = got / (time.perf_counter() - started)
        await asyncio.sleep(1.0)
        cpu = {n: (cpu_s(p) - cpu0[n]) * 1e6 for n, p in pids.items()}
        leader = (await js.consumer_info(stream, "bench-reader")).cluster
    finally:
        await nc.close()
    return {
        "messages": got,
        "messages_per_s": round(rate),
        "consumer_leader": getattr(leader, "leader", "") or "",
        "cpu_us_per_message_by_node": {n: round(v / got, 2) for n, v in sorted(cpu.items())},
        "cpu_us_per_message_all_nodes": round(sum(cpu.values()) / got, 2),
        "max_node_cpu_us_per_message": round(max(cpu.values()) / got, 2),
    }


async def run_registry(urls: list[str], pids: dict[str, int], steps: int) -> dict[str, object]:
    """``steps`` step assignments (the gateway's per-step claim) over :data:`_STEP_SESSIONS`
    sessions, all sessions at once, on the R3 bucket; CPU per step by node."""
    t = _topology("KV", 1, 3)
    await _provision(urls, t)
    nc = await connect(urls)
    try:
        registry = await StepRegistry.open(nc, t)
        bucket = f"KV_{t.steps_bucket}"
        leader = ""
        for _ in range(50):
            leader = (await nc.jetstream().stream_info(bucket)).cluster.leader or ""  # type: ignore[union-attr]
            if leader:
                break
            await asyncio.sleep(0.2)
        per_session = max(1, steps // _STEP_SESSIONS)
        sessions = [str(uuid.uuid4()) for _ in range(_STEP_SESSIONS)]
        seq0 = (await nc.jetstream().stream_info(bucket)).state.last_seq

        async def one(session: str) -> None:
            for k in range(per_session):
                await registry.next_step(session, new_turn=k == 0)

        cpu0, started = {n: cpu_s(p) for n, p in pids.items()}, time.perf_counter()
        await asyncio.gather(*(one(s) for s in sessions))
        rate = per_session * len(sessions) / (time.perf_counter() - started)
        await asyncio.sleep(1.0)
        cpu = {n: (cpu_s(p) - cpu0[n]) * 1e6 for n, p in pids.items()}
        writes = (await nc.jetstream().stream_info(bucket)).state.last_seq - seq0
        await registry.close()
    finally:
        await nc.close()
    done = per_session * len(sessions)
    return {
        "steps": done,
        "writes_per_step": round(writes / done, 3),
        "steps_per_s": round(rate),
        "leader": leader,
        "cpu_us_per_step_by_node": {n: round(v / done, 2) for n, v in sorted(cpu.items())},
        "cpu_us_per_step_all_nodes": round(sum(cpu.values()) / done, 2),
        "leader_node_cpu_us_per_step": round(cpu.get(leader, max(cpu.values())) / done, 2),
    }


async def measure(chunks: int, steps: int = STEPS) -> dict[str, object]:
    v1, framed = v1_load(chunks), framed_load(chunks)
    out: dict[str, object] = {"chunks": chunks, "per_frame": PER_FRAME}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = EmbeddedCluster(Path(tmp) / "cluster").start()
        try:
            urls, pids = cluster.urls, {s.name: s.pid for s in cluster.servers}
            k1 = _topology("K1", 1, 3)
            out["k1"] = await run_layout(urls, pids, k1, v1)
            out["consume_v1"] = await run_consume(urls, pids, k1)
            k1f = _topology("K1F", 1, 3)
            out["k1f"] = await run_layout(urls, pids, k1f, framed)
            out["consume"] = await run_consume(urls, pids, k1f)
            out["k3f"] = await run_layout(urls, pids, _topology("K3F", 3, 3), framed)
            out["kv"] = await run_registry(urls, pids, steps)
        finally:
            cluster.stop()
        server = EmbeddedServer(Path(tmp) / "single").start()
        r1 = _topology("R1F", 1, 1)
        try:
            out["r1f"] = await run_layout([server.url], {"single": server.pid}, r1, framed)
            held = await _accounted(server.url, r1.stream)
        finally:
            server.stop()  # every block written and S2-compressed before its files are measured
        disk = disk_bytes(Path(tmp) / "single", r1.stream)
        disk = disk or disk_bytes(Path(tmp) / "single" / "jetstream", r1.stream)
        chunks_r1 = sum(c for *_, c in framed)
        out["recorded_frames"] = {
            "payload_bytes_per_chunk": round(sum(len(p) for _, _, p, _ in framed) / chunks_r1, 1),
            "stream_bytes_per_chunk": round(held / chunks_r1, 1),
            "disk_bytes_per_chunk": round(disk / chunks_r1, 1),
        }
    framed_r3, framed_r1 = out["k1f"], out["r1f"]
    assert isinstance(framed_r3, dict)
    assert isinstance(framed_r1, dict)
    leader_us = float(framed_r3["leader_node_cpu_us_per_message"])
    out["one_stream_ceiling_messages_per_s_per_leader_core"] = round(1e6 / leader_us)
    out["r3_over_r1_per_message"] = round(
        float(framed_r3["cpu_us_per_message_all_nodes"])
        / float(framed_r1["cpu_us_per_message_all_nodes"]),
        3,
    )
    return out


def _flatten(prefix: str, values: dict[str, object]) -> None:
    for key, value in values.items():
        if isinstance(value, int | float):
            FIGURES[f"{prefix}_{key}"] = float(value)
        elif isinstance(value, dict) and key.startswith("cpu_"):
            for node, v in value.items():
                FIGURES[f"{prefix}_{key}_{node}"] = float(v)


def main() -> str:
    """The suite's entry (``python -m bench shards``): the table; FIGURES filled."""
    FIGURES.clear()
    load0 = os.getloadavg()[0]
    result = asyncio.run(measure(CHUNKS))
    load1 = os.getloadavg()[0]
    FIGURES["load_avg_1m_start"], FIGURES["load_avg_1m_end"] = load0, load1
    rows = []
    for key, label in (
        ("k1", "1, v1"),
        ("k1f", "1, frames"),
        ("k3f", "3, frames"),
        ("r1f", "1, frames, one server (R1)"),
    ):
        r = result[key]
        assert isinstance(r, dict)
        _flatten(key, r)
        by_node = ", ".join(f"{n} {v}" for n, v in r["cpu_us_per_message_by_node"].items())
        rows.append(
            f"| {label} | {r['messages_per_chunk']} | {r['leaders'] or '-'} "
            f"| {r['acked_messages_per_s']:,} | {r['acked_chunks_per_s']:,} | {by_node} "
            f"| {r['cpu_us_per_message_all_nodes']} "
            f"| {r['leader_node_cpu_us_per_message']} "
            f"| {r['cpu_us_per_chunk_all_nodes']} |"
        )
    kv, recorded, consume = result["kv"], result["recorded_frames"], result["consume"]
    consume_v1 = result["consume_v1"]
    assert isinstance(kv, dict)
    assert isinstance(recorded, dict)
    assert isinstance(consume, dict)
    assert isinstance(consume_v1, dict)
    _flatten("kv", kv)
    _flatten("consume", consume)
    _flatten("consume_v1", consume_v1)
    reader = ", ".join(f"{n} {v}" for n, v in consume["cpu_us_per_message_by_node"].items())
    _flatten("recorded", recorded)
    ceiling = result["one_stream_ceiling_messages_per_s_per_leader_core"]
    ratio = result["r3_over_r1_per_message"]
    assert isinstance(ceiling, int)
    assert isinstance(ratio, float)
    FIGURES["one_stream_ceiling_messages_per_s"] = float(ceiling)
    FIGURES["r3_over_r1_per_message"] = ratio
    kv_nodes = ", ".join(f"{n} {v}" for n, v in kv["cpu_us_per_step_by_node"].items())
    return "\n".join(
        [
            f"{CHUNKS:,} recorded-stream chunks per layout, three nats-servers on loopback, "
            "R3, S2; "
            f"frames: first and last chunk alone, the others {PER_FRAME} to a frame",
            "",
            "| shards, wire | messages/chunk | leaders per node | acked messages/s (one client) "
            "| acked chunks/s | CPU us/message by node | CPU us/message, all nodes "
            "| leader node us/message | CPU us/chunk, all nodes |",
            "| --- | ---: | --- | ---: | ---: | --- | ---: | ---: | ---: |",
            *rows,
            "",
            f"one stream's ceiling with frames, its leader on a core of its own: ~{ceiling:,} "
            f"messages/s; the cluster's CPU per message over one server's (R3 / R1): {ratio}x",
            "",
            f"one durable pull consumer reading and acking the K = 1 frames stream (consumer "
            f"leader {consume['consumer_leader'] or '?'}): "
            f"{consume['messages_per_s']:,} messages/s; "
            f"CPU us per message by node: {reader}; all nodes "
            f"{consume['cpu_us_per_message_all_nodes']}; the same on the K = 1 v1 stream (one "
            f"message per chunk): {consume_v1['messages_per_s']:,} messages/s, all nodes "
            f"{consume_v1['cpu_us_per_message_all_nodes']}, busiest node "
            f"{consume_v1['max_node_cpu_us_per_message']}",
            "",
            f"step registry (R3 bucket, leader {kv['leader']}): {kv['steps']:,} step assignments, "
            f"{kv['writes_per_step']} writes per step, {kv['steps_per_s']:,} steps/s (one client); "
            f"CPU us per step by node: {kv_nodes}; all nodes {kv['cpu_us_per_step_all_nodes']}",
            "",
            f"the frames load on the single server, per chunk: payload "
            f"{recorded['payload_bytes_per_chunk']} B, accounted (state.bytes) "
            f"{recorded['stream_bytes_per_chunk']} B, on disk with S2 "
            f"{recorded['disk_bytes_per_chunk']} B",
        ]
    )


if __name__ == "__main__":
    print(json.dumps(asyncio.run(measure(CHUNKS)), indent=2, default=str))
