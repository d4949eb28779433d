"""Telemetry cost grows with steps, not tokens.

In one run on one embedded nats-server, steps of ``CHUNKS_BIG`` chunks and steps of 10 chunks
go to two topologies, and we measure the telemetry consumer's CPU time (this process's; the
broker and the publisher run in others) and its deliveries. The broker selects first chunks by
subject, so both cases see one delivery per step and should cost about the same. Target: at
most 1.5x apart.

Two ways to meet the steps, both measured:

- **live** (the target's figure): a publisher in a child process paces ``LIVE_RATE`` steps a
  second while the consumer runs caught up, as in a deployment; the CPU window is the same
  length in both cases and holds the same deliveries.
- **backlog drain**: the steps are published first and the consumer drains them
  (``burst``), as after an outage. It handles the first chunks a read brings side by side
  (``PullSettings.concurrent``), so its CPU per step falls with the size of those groups; in
  the big case the server skips each step's other chunks to find the next first chunk,
  deliveries come in smaller groups, and the ratio reads above 1 (docs/benchmarks.md,
  session 20). A small warm-up drain comes first, so that neither case pays for the
  consumer's first run.
"""

from __future__ import annotations

import asyncio
import json
import sys
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
LIVE_RATE = 50.0  # steps a second the live case's publisher paces
SETTLE_S = 120.0  # bound on the wait for the live consumer to ack every first chunk
REPO = Path(__file__).resolve().parents[1]
FIGURES: dict[str, float] = {}  # the last run's figures, for the suite (bench/_suite.py)


def _topology(tag: str) -> Topology:
    return Topology(
        prefix=tag,
        stream=f"T_{tag}",
        events_stream=f"TE_{tag}",
        dlq_stream=f"TD_{tag}",
        steps_bucket=f"ts-{tag}",
        partitions=4,
        max_bytes=1024**3,
    )


async def _publish(
    nc: Client, t: Topology, chunks_per_step: int, steps: int, rate: float | None = None
) -> int:
    """Publish ``steps`` steps of ``chunks_per_step`` chunks, each step at once; with ``rate``,
    step k starts k / rate seconds after the first."""
    publisher = await ChunkPublisher(nc, t, window=4096).start()
    published = 0
    loop = asyncio.get_running_loop()
    start = loop.time()
    for k in range(steps):
        if rate is not None:
            await asyncio.sleep(max(0.0, start + k / rate - loop.time()))
        session, step = f"s{k % SESSIONS}", k // SESSIONS
        for ordinal in range(chunks_per_step):
            last = ordinal == chunks_per_step - 1
            chunk = Finish(reason="stop") if last else TextDelta(index=0, text="tok")
            env = ChunkEnvelope(
                session=session,
                turn=0,
                step=step,
                ordinal=ordinal,
                time_ns=2_000 + ordinal,
                provider="scripted",
                model="bench",
                chunk=chunk,
                request_time_ns=1_000 if ordinal == 0 else None,
            )
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


async def _live(nc: Client, url: str, t: Topology, chunks: int) -> tuple[float, float, int]:
    """The live case: the consumer runs caught up while a child process paces the steps.
    (CPU s, wall s) from the child's start until every first chunk is acked, and deliveries."""
    consumer = TelemetryConsumer(nc=nc, topology=t, metrics=TelemetryMetrics())
    stop = asyncio.Event()
    running = asyncio.create_task(consumer.run(stop))
    cpu, wall = time.process_time(), time.perf_counter()
    script = "import sys; from bench.bench_telemetry import live_main; live_main(sys.argv[1:])"
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        script,
        url,
        t.prefix,
        str(chunks),
        str(STEPS),
        str(LIVE_RATE),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"the publisher process failed ({child.returncode})")
    delivered = await _settled(nc, t, STEPS)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    stop.set()
    await running
    if json.loads(out)["published"] != chunks * STEPS:
        raise RuntimeError("the publisher process published short")
    return cpu, wall, delivered


async def _settled(nc: Client, t: Topology, steps: int) -> int:
    """Wait (at most SETTLE_S) until the consumer has acked ``steps`` deliveries; return how
    many it was delivered."""
    js = nc.jetstream()
    deadline = time.monotonic() + SETTLE_S
    while True:
        info = await js.consumer_info(t.stream, t.telemetry_consumer)
        acked = info.ack_floor.consumer_seq >= steps
        if acked and info.num_pending == 0 and info.num_ack_pending == 0:
            return int(info.delivered.consumer_seq)
        if time.monotonic() > deadline:
            raise TimeoutError(f"telemetry acked {info.ack_floor.consumer_seq} of {steps}")
        await asyncio.sleep(0.05)


def live_main(argv: list[str]) -> None:
    """The publisher process of :func:`_live`: ``url prefix chunks steps rate`` in, JSON out."""
    url, prefix, chunks, steps, rate = argv

    async def go() -> int:
        nc = await connect(url)
        try:
            return await _publish(nc, _topology(prefix), int(chunks), int(steps), float(rate))
        finally:
            await nc.close()

    print(json.dumps({"published": asyncio.run(go())}))


async def _main() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        async with EmbeddedServer(Path(tmp)) as server:
            nc = await connect(server.url)
            warm = _topology("telwarm")
            await ensure_topology(nc, warm)
            await _publish(nc, warm, 2, WARM_STEPS)
            await _consume(nc, warm)
            live, drain = {}, {}
            for chunks in (CHUNKS_BIG, 10):
                t = _topology(f"tellive{chunks}")
                await ensure_topology(nc, t)
                live[chunks] = (chunks * STEPS, *await _live(nc, server.url, t, chunks))
            for chunks in (CHUNKS_BIG, 10):
                t = _topology(f"tel{chunks}")
                await ensure_topology(nc, t)
                published = await _publish(nc, t, chunks, STEPS)
                drain[chunks] = (published, *await _consume(nc, t))
            await nc.close()
    ratio = live[CHUNKS_BIG][1] / live[10][1]
    FIGURES.update(
        deliveries_per_step=live[CHUNKS_BIG][3] / STEPS,
        cpu_ratio=ratio,
        drain_cpu_ratio=drain[CHUNKS_BIG][1] / drain[10][1],
    )
    lines = [
        "| case | chunks on the stream | deliveries to telemetry | consumer CPU s | wall s |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, rows in ((f"live, {LIVE_RATE:g} steps/s", live), ("backlog drain", drain)):
        for chunks, (pub, cpu, wall, dl) in rows.items():
            lines.append(
                f"| {name}: {STEPS:,} steps x {chunks:,} chunks | {pub:,} | {dl:,} "
                f"| {cpu:.3f} | {wall:.3f} |"
            )
        (bp, bc, bw, bd), (sp, sc, sw, sd) = rows[CHUNKS_BIG], rows[10]
        target = " (target <= 1.5x)" if rows is live else ""
        lines.append(
            f"| {name}: ratio ({CHUNKS_BIG:,} / 10) | {bp / sp:.0f}x | {bd / sd:.2f}x "
            f"| **{bc / sc:.2f}x**{target} | {bw / sw:.2f}x |"
        )
    return "\n".join(lines)


def main() -> str:
    return asyncio.run(_main())
