"""Telemetry cost grows with steps, not tokens.

In one run on one embedded nats-server: 1,000 steps of 1,000 chunks and 1,000 steps of 10
chunks are published to two topologies; the telemetry consumer then drains each (burst mode)
and we measure its CPU time (this process's, the broker runs in another) and its deliveries.
The broker selects first chunks by subject, so both runs see 1,000 deliveries and should cost
about the same. Target: at most 1.5x apart.

A small warm-up drain comes first, so that neither case pays for the consumer's first run. The
default profile drains 1,000 steps of 200 chunks: at 200 steps the consumer's CPU (30-90 ms)
read 0.52x to 1.72x over runs of one build, noise rather than a figure.

Both cases drain a backlog. The consumer handles the first chunks a read brings side by side
(``PullSettings.concurrent``), so its CPU per step falls with the size of those groups; in the
big case the server skips 199 of every 200 messages to find the next first chunk, deliveries
come in smaller groups, and the ratio reads above 1 (docs/benchmarks.md, session 20). A live
consumer, caught up, gets first chunks as they are published, whatever the step's length.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from nats.aio.client import Client

from tokenwire.broker import ChunkPublisher, EmbeddedServer, Topology, connect, ensure_topology
from tokenwire.schemas import ChunkEnvelope, Finish, TextDelta, json_encoder
from tokenwire.services.telemetry import TelemetryConsumer, TelemetryMetrics

STEPS = 1_000
SESSIONS = 50
CHUNKS_BIG = 1_000  # chunks per step of the big case
WARM_STEPS = 20  # the warm-up drain's steps (two chunks each)
FIGURES: dict[str, float] = {}  # the last run's figures, for the suite (bench/_suite.py)


def _topology(tag: str) -> Topology:
    return Topology(prefix=tag, stream=f"T_{tag}", events_stream=f"TE_{tag}",
                    dlq_stream=f"TD_{tag}", steps_bucket=f"ts-{tag}", partitions=4,
                    max_bytes=2 * 1024**3)  # fmt: skip


async def _publish(nc: Client, t: Topology, chunks_per_step: int, steps: int) -> int:
    publisher = await ChunkPublisher(nc, t, window=4096).start()
    published = 0
    for k in range(steps):
        session, step = f"s{k % SESSIONS}", k // SESSIONS
        for ordinal in range(chunks_per_step):
            last = ordinal == chunks_per_step - 1
            chunk = Finish(reason="stop") if last else TextDelta(index=0, text="tok")
            env = ChunkEnvelope(
                session=session, turn=0, step=step, ordinal=ordinal, time_ns=2_000 + ordinal,
                provider="scripted", model="bench", chunk=chunk,
                request_time_ns=1_000 if ordinal == 0 else None,
            )  # fmt: skip
            await publisher.publish(
                json_encoder.encode(env), session, 0, step, ordinal, first=ordinal == 0
            )
            published += 1
    await publisher.flush(120)
    await publisher.close()
    return published


async def _consume(nc: Client, t: Topology) -> tuple[float, float, int]:
    metrics = TelemetryMetrics()
    consumer = TelemetryConsumer(nc=nc, topology=t, metrics=metrics)
    cpu, wall = time.process_time(), time.perf_counter()
    await consumer.run(asyncio.Event(), burst=True)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    info = await nc.jetstream().consumer_info(t.stream, t.telemetry_consumer)
    return cpu, wall, int(info.delivered.consumer_seq)


async def _main() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        async with EmbeddedServer(Path(tmp)) as server:
            nc = await connect(server.url)
            warm = _topology("telwarm")
            await ensure_topology(nc, warm)
            await _publish(nc, warm, 2, WARM_STEPS)
            await _consume(nc, warm)
            rows = []
            for chunks in (CHUNKS_BIG, 10):
                t = _topology(f"tel{chunks}")
                await ensure_topology(nc, t)
                published = await _publish(nc, t, chunks, STEPS)
                cpu, wall, delivered = await _consume(nc, t)
                rows.append((chunks, published, delivered, cpu, wall))
            await nc.close()
    (_, big_pub, big_del, big_cpu, big_wall), (_, pub, dl, cpu, wall) = rows
    FIGURES.update(deliveries_per_step=big_del / STEPS, cpu_ratio=big_cpu / cpu)
    lines = [
        "| case | chunks on the stream | deliveries to telemetry | consumer CPU s | wall s |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| {STEPS:,} steps x {CHUNKS_BIG:,} chunks | {big_pub:,} | {big_del:,} | {big_cpu:.3f} "
        f"| {big_wall:.3f} |",
        f"| {STEPS:,} steps x 10 chunks (baseline) | {pub:,} | {dl:,} | {cpu:.3f} | {wall:.3f} |",
        f"| ratio ({CHUNKS_BIG:,} / 10) | {big_pub / pub:.0f}x | {big_del / dl:.2f}x | "
        f"**{big_cpu / cpu:.2f}x** (target <= 1.5x) | {big_wall / wall:.2f}x |",
    ]
    return "\n".join(lines)


def main() -> str:
    return asyncio.run(_main())
