"""The limits, measured first in the run, on this machine, with nothing of tokenwire's on top.

(1) pipelined JetStream publish with acks (``bench_publish.raw_pipeline``: nats-py's public
    API, ``Nats-Msg-Id`` and trace headers, every ack counted in a callback), gateway-sized
    envelopes;
(2) a push-consumer callback acknowledging every message (``bench_publish.bench_raw_consume``);
(3) an ordered-consumer read of the same stream, a callback that only counts;
(4) ``json.loads`` of every ``data:`` line of the scripted provider's own SSE bytes (the
    stream every later phase sends), split naively;
(5) a bare streaming proxy hop (uvicorn + httptools on uvloop, aiohttp upstream, bytes passed
    through: ``bench_gateway``'s floor): added time to first byte for a lone sequential caller
    and 50 paced callers, and events/s at full speed, beside the scripted provider called
    directly.

Every tokenwire figure of the report is a ratio to one of these.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import uvloop
from nats.aio.client import Client
from nats.aio.msg import Msg

from bench import bench_gateway as gw
from bench._procs import scripted_and_proxy
from bench._suite import Figures, Profile, pct, sizes
from bench.bench_publish import bench_raw_consume, raw_pipeline
from tokenwire.broker import EmbeddedServer, Topology, connect, ensure_topology

PHASE = "limits"


def _topology() -> Topology:
    return Topology(
        prefix="lim",
        stream="LIM",
        events_stream="LIME",
        dlq_stream="LIMD",
        steps_bucket="lim-steps",
        partitions=16,
        max_bytes=2 * 1024**3,
    )


async def ordered_read(nc: Client, t: Topology, total: int) -> float:
    """(3) messages/s of nats-py's ordered consumer over the whole stream, counting only."""
    done = asyncio.Event()
    count = 0

    async def on_msg(msg: Msg) -> None:
        nonlocal count
        count += 1
        if count == total:
            done.set()

    started = time.perf_counter()
    sub = await nc.jetstream().subscribe(
        f"{t.prefix}.chunks.>", stream=t.stream, ordered_consumer=True, cb=on_msg
    )
    await asyncio.wait_for(done.wait(), 300)
    rate = total / (time.perf_counter() - started)
    await sub.unsubscribe()
    return rate


async def broker_limits(fig: Figures, n: int) -> None:
    """(1), (2), (3) on one fresh embedded nats-server."""
    with tempfile.TemporaryDirectory(prefix="tw-limits-") as tmp:
        async with EmbeddedServer(Path(tmp)) as server:
            nc = await connect(server.url)
            t = _topology()
            await ensure_topology(nc, t)
            rate, cpu_us = await raw_pipeline(
                nc, t, gw.ENVELOPE, n=n, sessions=200, headers=gw.TRACE, mark_first=True
            )
            fig.put(PHASE, "publish_per_s", rate)
            fig.put(PHASE, "publish_cpu_us", cpu_us)
            fig.put(PHASE, "consume_ack_per_s", await bench_raw_consume(nc, t, n))
            fig.put(PHASE, "ordered_read_per_s", await ordered_read(nc, t, n))
            fig.put(PHASE, "envelope_bytes", len(gw.ENVELOPE))
            await nc.close()


async def _sse_body(port: int, fragments: int) -> bytes:
    caller = await gw.Caller.open(port)
    request = gw.streaming_request(port, "/v1/chat/completions", "lim", f"fragments={fragments}")
    caller.writer.write(request)
    data = b""
    while not data.endswith(b"\r\n0\r\n\r\n"):
        data += await caller._read()
    caller.close()
    return data


def json_limit(body: bytes, repeat: int) -> float:
    """(4) events/s of ``json.loads`` over every ``data:`` line of ``body``, best of runs."""
    lines = [ln[6:] for ln in body.split(b"\n") if ln.startswith(b"data: {")]
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        for _ in range(20):
            for line in lines:
                json.loads(line)
        best = min(best, time.perf_counter() - started)
    return 20 * len(lines) / best


async def proxy_limits(fig: Figures, profile: Profile) -> None:
    """(4) and (5): the scripted provider and the bare proxy as processes."""
    serial = sizes(profile, 5, 100, 200)  # smoke: as bench_stack's
    async with scripted_and_proxy() as (sp_port, px_port, procs):
        body = await _sse_body(sp_port, 200)
        fig.put(PHASE, "json_loads_per_s", json_limit(body, 5))
        fig.put(PHASE, "sse_bytes_per_event", len(body) / max(1, body.count(b"data: ")))
        lone = await gw.bench_ttfc(sp_port, px_port, 1, serial)
        hot = await gw.bench_ttfc(sp_port, px_port, gw.SESSIONS_D, gw.PAIRS_D)
        from bench.bench_stack import FIRST_TOKEN_S

        ttft = await gw.bench_ttfc(sp_port, px_port, 1, serial, FIRST_TOKEN_S)
        for tag, pairs in (("lone", lone), ("hot", hot), ("ttft", ttft)):
            direct = [d * 1000 for d, _ in pairs]
            added = [(p - d) * 1000 for d, p in pairs]
            fig.put(PHASE, f"direct_ttfb_{tag}_p50_ms", pct(direct, 0.5))
            fig.put(PHASE, f"direct_ttfb_{tag}_p99_ms", pct(direct, 0.99))
            fig.put(PHASE, f"proxy_added_{tag}_p50_ms", pct(added, 0.5))
            fig.put(PHASE, f"proxy_added_{tag}_p99_ms", pct(added, 0.99))
        fragments = gw.FRAGMENTS_B
        direct_load = await gw.bench_load([sp_port], "ld", procs, None, fragments)
        proxy_load = await gw.bench_load([px_port], "lp", procs, None, fragments)
        fig.put(PHASE, "direct_events_per_s", direct_load.rate)
        fig.put(PHASE, "proxy_events_per_s", proxy_load.rate)
        fig.put(PHASE, "proxy_cpu_us_per_event", proxy_load.us_per_unit("proxy"))
        fig.put(PHASE, "scripted_cpu_us_per_event", direct_load.us_per_unit("scripted"))


def table(fig: Figures) -> str:
    v = fig.values.get(PHASE, {})

    def g(k: str) -> float:
        return v.get(k, float("nan"))

    return "\n".join(
        [
            "| limit | figure |",
            "| --- | ---: |",
            f"| (1) pipelined JetStream publish with acks, msgs/s ({g('envelope_bytes'):.0f} B "
            f"envelopes) | {g('publish_per_s'):,.0f} |",
            f"| (1) its CPU per message in the publishing process, us | {g('publish_cpu_us'):.1f} |",
            f"| (2) push consumer, callback acking every message, msgs/s "
            f"| {g('consume_ack_per_s'):,.0f} |",
            f"| (3) ordered consumer read, msgs/s | {g('ordered_read_per_s'):,.0f} |",
            f"| (4) json.loads over the scripted provider's SSE data lines, events/s "
            f"| {g('json_loads_per_s'):,.0f} |",
            f"| (5) scripted provider direct, full speed, events/s "
            f"| {g('direct_events_per_s'):,.0f} |",
            f"| (5) bare streaming proxy hop, full speed, events/s "
            f"| {g('proxy_events_per_s'):,.0f} |",
            f"| (5) bare proxy CPU per event, us | {g('proxy_cpu_us_per_event'):.1f} |",
            f"| (5) direct first byte, lone caller, p50 / p99 ms "
            f"| {g('direct_ttfb_lone_p50_ms'):.2f} / {g('direct_ttfb_lone_p99_ms'):.2f} |",
            f"| (5) bare proxy added first byte, lone caller, p50 / p99 ms "
            f"| {g('proxy_added_lone_p50_ms'):+.2f} / {g('proxy_added_lone_p99_ms'):+.2f} |",
            f"| (5) bare proxy added first byte, {gw.SESSIONS_D} paced callers, p50 / p99 ms "
            f"| {g('proxy_added_hot_p50_ms'):+.2f} / {g('proxy_added_hot_p99_ms'):+.2f} |",
        ]
    )


def run(fig: Figures, profile: Profile) -> str:
    n = sizes(profile, 3_000, 60_000, 200_000)
    asyncio.run(broker_limits(fig, n))
    uvloop.run(proxy_limits(fig, profile))
    return table(fig)
