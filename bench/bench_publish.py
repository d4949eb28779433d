"""Broker paths on one embedded nats-server: publish (baseline, ours, the raw limit), consume.

(a) ``js.publish`` awaited one at a time — the naive baseline;
(b) ``ChunkPublisher``: pipelined, Nats-Msg-Id on every chunk, every ack counted;
(c) a raw pipelined loop with a reply inbox and Msg-Id, no bookkeeping — the limit for (b);
(d) consume: a raw push-consumer callback acking every message (the limit) vs our grouped
    ``PullConsumer`` (assembler-p0, pinned_client) with a no-op handler.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api

from tokenwire.broker import (
    ChunkPublisher,
    ConsumedMessage,
    EmbeddedServer,
    PullSettings,
    Topology,
    chunk_subject,
    connect,
    ensure_topology,
    msg_id,
    partition_consumer,
)

N_BASELINE = 3_000
N = 60_000
SESSIONS = 100
PAYLOAD = b'{"session":"s","turn":0,"step":0,"ordinal":1,"chunk":{"type":"text-delta","text":"hi"}}'


def _topology(tag: str) -> Topology:
    return Topology(
        prefix=tag,
        stream=f"B_{tag}",
        events_stream=f"BE_{tag}",
        dlq_stream=f"BD_{tag}",
        steps_bucket=f"bs-{tag}",
        partitions=1,
        max_bytes=1024**3,
    )


async def bench_js_publish(nc: Client, t: Topology) -> float:
    js = nc.jetstream()
    started = time.perf_counter()
    for i in range(N_BASELINE):
        subject = chunk_subject(t, f"s{i % SESSIONS}", first=False)
        await js.publish(subject, PAYLOAD, headers={"Nats-Msg-Id": f"a:{i}"})
    return N_BASELINE / (time.perf_counter() - started)


async def bench_chunk_publisher(nc: Client, t: Topology) -> float:
    publisher = await ChunkPublisher(nc, t).start()
    started = time.perf_counter()
    for i in range(N):
        session, ordinal = f"s{i % SESSIONS}", i // SESSIONS
        await publisher.publish(PAYLOAD, session, 0, 0, ordinal, first=ordinal == 0)
    await publisher.flush(60)
    rate = N / (time.perf_counter() - started)
    stats = publisher.stats()
    await publisher.close()
    if stats.acked != N or stats.failed:
        raise RuntimeError(f"publisher lost acks: {stats}")
    return rate


async def raw_pipeline(
    nc: Client,
    t: Topology,
    payload: bytes,
    *,
    n: int = N,
    sessions: int = SESSIONS,
    headers: dict[str, str] | None = None,
    mark_first: bool = False,
) -> tuple[float, float]:
    """The publish limit: ``n`` core publishes with a reply subject and ``Nats-Msg-Id`` (plus
    ``headers``) through nats-py's public API, every ack counted in a callback, nothing else;
    ordinal 0 of each session to its ``first`` subject when ``mark_first``. Returns
    (messages/s, CPU us per message of this process)."""
    done = asyncio.Event()
    acked = 0

    async def on_ack(msg: Msg) -> None:
        nonlocal acked
        acked += 1
        if acked == n:
            done.set()

    prefix = nc.new_inbox() + "."
    sub = await nc.subscribe(prefix + "*", cb=on_ack)
    cpu, started = time.process_time(), time.perf_counter()
    for i in range(n):
        session, ordinal = f"r{i % sessions}", i // sessions
        message_headers = {**(headers or {}), "Nats-Msg-Id": msg_id(session, 0, 0, ordinal)}
        subject = chunk_subject(t, session, first=mark_first and ordinal == 0)
        await nc.publish(subject, payload, reply=f"{prefix}{i}", headers=message_headers)
    await asyncio.wait_for(done.wait(), 60)
    rate = n / (time.perf_counter() - started)
    cpu_us = (time.process_time() - cpu) / n * 1e6
    await sub.unsubscribe()
    return rate, cpu_us


async def bench_raw_consume(nc: Client, t: Topology, total: int) -> float:
    done = asyncio.Event()
    count = 0

    async def on_msg(msg: Msg) -> None:
        nonlocal count
        await msg.ack()
        count += 1
        if count == total:
            done.set()

    config = api.ConsumerConfig(ack_policy=api.AckPolicy.EXPLICIT, max_ack_pending=200_000)
    started = time.perf_counter()
    sub = await nc.jetstream().subscribe(
        f"{t.prefix}.chunks.>", stream=t.stream, cb=on_msg, manual_ack=True, config=config
    )
    await asyncio.wait_for(done.wait(), 60)
    rate = total / (time.perf_counter() - started)
    await sub.unsubscribe()
    return rate


async def bench_partition_consumer(nc: Client, t: Topology, total: int) -> float:
    done = asyncio.Event()
    count = 0

    async def handle(msg: ConsumedMessage) -> None:
        nonlocal count
        count += 1
        if count == total:
            done.set()

    consumer = partition_consumer(nc, t, 0, handle, PullSettings(batch=1024))
    started = time.perf_counter()
    await consumer.start()
    await asyncio.wait_for(done.wait(), 60)
    rate = total / (time.perf_counter() - started)
    await consumer.stop()
    return rate


async def _run(data_dir: Path) -> list[tuple[str, float, str, float]]:
    async with EmbeddedServer(data_dir) as server:
        nc = await connect(server.url)
        a, b, c = _topology("ba"), _topology("bb"), _topology("bc")
        for t in (a, b, c):
            await ensure_topology(nc, t)
        baseline = await bench_js_publish(nc, a)
        ours = await bench_chunk_publisher(nc, b)
        raw, _ = await raw_pipeline(nc, c, PAYLOAD)
        raw_consume = await bench_raw_consume(nc, b, N)
        our_consume = await bench_partition_consumer(nc, b, N)
        await nc.close()
    return [
        ("publish: ChunkPublisher vs js.publish awaited", ours, "js.publish awaited", baseline),
        ("publish: ChunkPublisher vs raw pipelined loop", ours, "raw pipeline (limit)", raw),
        ("consume: PullConsumer vs raw push callback", our_consume, "raw push + ack", raw_consume),
    ]


def main() -> str:
    with tempfile.TemporaryDirectory(prefix="tw-bench-") as tmp:
        rows = asyncio.run(_run(Path(tmp)))
    lines = [
        f"{N:,} messages ({len(PAYLOAD)} B, {SESSIONS} sessions; baseline {N_BASELINE:,}), "
        "one embedded nats-server, loopback",
        "",
        "| path | ours (msg/s) | baseline | baseline (msg/s) | ratio |",
        "| --- | ---: | --- | ---: | ---: |",
    ]
    for name, ours, base_name, base in rows:
        lines.append(f"| {name} | {ours:,.0f} | {base_name} | {base:,.0f} | {ours / base:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(main())
