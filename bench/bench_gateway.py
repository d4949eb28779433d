"""The gateway on one embedded nats-server, against the publish limit and the direct call.

(a) the limit: ``ChunkPublisher`` (pipelined JetStream publish, Msg-Id, every ack counted)
    with gateway-sized envelopes, in this process;
(b) the gateway (its own process, uvicorn) with 200 concurrent streaming sessions from the
    scripted provider (its own process) at full speed: chunks published per second, from
    the first request to the last response (each response ends only after its acks);
(b0) the same load sent to the scripted provider directly (events/s it streams): the
    upstream's own ceiling, which bounds (b) on this machine;
(d) time to first chunk (first body bytes of the SSE response) for 50 concurrent sessions,
    through the gateway vs calling the scripted provider directly; p50/p99 and the difference.

The load generator (this process) reads the bodies without parsing them. All of it shares the
machine's cores: the figures are end-to-end, not the gateway alone.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tokenwire.broker import (
    ChunkPublisher,
    EmbeddedServer,
    Topology,
    connect,
    ensure_topology,
    free_port,
)
from tokenwire.schemas import ChunkEnvelope, TextDelta, json_encoder

SESSIONS_B = 200
FRAGMENTS_B = 100
SESSIONS_D = 50
ROUNDS_D = 8
SERIAL_D = 200
N_A = 60_000
ENVELOPE = json_encoder.encode(
    ChunkEnvelope("bench-session-000", 0, 0, 17, time.time_ns(), "scripted", "text",
                  TextDelta(0, "abcd"))
)  # fmt: skip
TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}

_SCRIPTED = """
import asyncio, sys
from tokenwire.services.scripted_provider import ScriptedSettings, serve
asyncio.run(serve("127.0.0.1", int(sys.argv[1]), ScriptedSettings(length=int(sys.argv[2]))))
"""
_GATEWAY = """
import asyncio, sys
from tokenwire.services.gateway import GatewaySettings, run
env = {"TOKENWIRE_SCRIPTED_BASE_URL": sys.argv[3]}
settings = GatewaySettings(port=int(sys.argv[1]), nats_url=sys.argv[2], provider_env=env)
asyncio.run(run(settings))
"""


async def bench_publish_limit(url: str) -> float:
    """(a) chunks/s of the broker package's publisher, acks included."""
    nc = await connect(url)
    t = Topology(prefix="bench", stream="BENCH", events_stream="BENCHE", dlq_stream="BENCHD",
                 steps_bucket="bench-steps", partitions=16, max_bytes=1024**3)  # fmt: skip
    await ensure_topology(nc, t)
    publisher = await ChunkPublisher(nc, t).start()
    started = time.perf_counter()
    for i in range(N_A):
        session, ordinal = f"s{i % SESSIONS_B}", i // SESSIONS_B
        await publisher.publish(ENVELOPE, session, 0, 0, ordinal, first=ordinal == 0, headers=TRACE)
    await publisher.flush(60)
    rate = N_A / (time.perf_counter() - started)
    await publisher.close()
    await nc.close()
    return rate


def _spawn(code: str, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip


async def _wait_up(url: str, timeout_s: float = 30.0) -> None:
    async with httpx.AsyncClient() as client:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if (await client.get(url + "/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


async def _stream(client: httpx.AsyncClient, url: str, session: str, fragments: int) -> float:
    """Stream one step; returns seconds to the first body bytes."""
    body = {
        "model": f"scripted/text?fragments={fragments}",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
    }
    started = time.perf_counter()
    first = None
    async with client.stream(
        "POST", url, json=body, headers={"x-tokenwire-session": session}
    ) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{url}: HTTP {response.status_code}")
        async for _ in response.aiter_raw():
            first = first or time.perf_counter() - started
    return first or 0.0


async def _stream_count(url: str) -> int:
    nc = await connect(url)
    info = await nc.jetstream().stream_info("TOKENWIRE")
    await nc.close()
    return int(info.state.messages)


def _client() -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    return httpx.AsyncClient(timeout=120, limits=limits)


async def bench_direct_throughput(scripted: str) -> float:
    """(b0) provider events/s with the same 200-session load and no gateway."""
    async with _client() as client:
        started = time.perf_counter()
        await asyncio.gather(
            *(_stream(client, scripted + "/v1/chat/completions", f"b0-{i}", FRAGMENTS_B)
              for i in range(SESSIONS_B))
        )  # fmt: skip
        elapsed = time.perf_counter() - started
    return SESSIONS_B * (FRAGMENTS_B + 4) / elapsed  # text deltas + role, finish, usage, [DONE]


async def bench_gateway_throughput(nats_url: str, gateway: str) -> tuple[float, int]:
    """(b) chunks/s published by the gateway under 200 concurrent sessions."""
    before = await _stream_count(nats_url)
    async with _client() as client:
        target = gateway + "/v1/chat/completions"
        started = time.perf_counter()
        await asyncio.gather(
            *(_stream(client, target, f"b-{i}", FRAGMENTS_B) for i in range(SESSIONS_B))
        )
        elapsed = time.perf_counter() - started
    chunks = await _stream_count(nats_url) - before
    return chunks / elapsed, chunks


async def bench_ttfc_serial(direct_url: str, gateway_url: str) -> tuple[list[float], list[float]]:
    """(d1) the same one request at a time: the gateway's own added latency, without queueing."""
    direct: list[float] = []
    through: list[float] = []
    async with _client() as client:
        for i in range(SERIAL_D):
            direct.append(await _stream(client, direct_url, f"sd-{i}", 8))
            through.append(await _stream(client, gateway_url, f"sg-{i}", 8))
    return direct, through


async def bench_ttfc(direct_url: str, gateway_url: str) -> tuple[list[float], list[float]]:
    """(d) seconds to first bytes, 50 concurrent sessions; direct and gateway rounds alternate
    so that drift on the shared machine affects both alike."""
    direct: list[float] = []
    through: list[float] = []
    async with _client() as client:
        for r in range(ROUNDS_D):
            for url, out, tag in ((direct_url, direct, "d"), (gateway_url, through, "g")):
                out.extend(
                    await asyncio.gather(
                        *(_stream(client, url, f"{tag}-{r}-{i}", 8) for i in range(SESSIONS_D))
                    )
                )
    return direct, through


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _run() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer(Path(tmp))
        server.start()
        sp_port, gw_port = free_port(), free_port()
        scripted = _spawn(_SCRIPTED, str(sp_port), str(FRAGMENTS_B))
        sp_url = f"http://127.0.0.1:{sp_port}"
        gateway = _spawn(_GATEWAY, str(gw_port), server.url, sp_url)
        gw_url = f"http://127.0.0.1:{gw_port}"
        try:
            await _wait_up(sp_url)
            await _wait_up(gw_url)
            limit = await bench_publish_limit(server.url)
            await bench_ttfc(sp_url + "/v1/chat/completions", gw_url + "/v1/chat/completions")
            direct_rate = await bench_direct_throughput(sp_url)
            rate, chunks = await bench_gateway_throughput(server.url, gw_url)
            urls = (sp_url + "/v1/chat/completions", gw_url + "/v1/chat/completions")
            direct, through = await bench_ttfc(*urls)
            serial = await bench_ttfc_serial(*urls)
        finally:
            for proc in (gateway, scripted):
                proc.terminate()
                proc.wait(10)
            server.stop()
    return (
        _table(limit, direct_rate, rate, chunks, direct, through)
        + "\n"
        + _ttfc_rows("(d1) one at a time", *serial)
    )


def _table(
    limit: float, direct_rate: float, rate: float, chunks: int,
    direct: list[float], through: list[float],
) -> str:  # fmt: skip
    rows = [
        "| measure | baseline | gateway | ratio / added | target |",
        "| --- | --- | --- | --- | --- |",
        f"| (a)/(b) chunks/s published with acks | {limit:,.0f} (ChunkPublisher alone) "
        f"| {rate:,.0f} ({SESSIONS_B} sessions, {chunks:,} chunks) "
        f"| {rate / limit:.2f}x | >= 0.5x |",
        f"| (b0)/(b) vs the provider alone, events/s | {direct_rate:,.0f} (scripted, direct) "
        f"| {rate:,.0f} | {rate / direct_rate:.2f}x | |",
    ]
    return "\n".join(rows) + "\n" + _ttfc_rows(f"(d) {SESSIONS_D} concurrent", direct, through)


def _ttfc_rows(label: str, direct: list[float], through: list[float]) -> str:
    ms = 1000.0
    d50, d99 = _pct(direct, 0.5) * ms, _pct(direct, 0.99) * ms
    g50, g99 = _pct(through, 0.5) * ms, _pct(through, 0.99) * ms
    mean_added = (statistics.mean(through) - statistics.mean(direct)) * ms
    return "\n".join(
        [
            f"| {label}: time to first chunk p50, ms | {d50:.2f} (direct) | {g50:.2f} "
            f"| {g50 - d50:+.2f} ms | <= +1 ms |",
            f"| {label}: time to first chunk p99, ms | {d99:.2f} (direct) | {g99:.2f} "
            f"| {g99 - d99:+.2f} ms | <= +5 ms |",
            f"| {label}: samples | {len(direct)} | {len(through)} | mean {mean_added:+.2f} ms | |",
        ]
    )


def main() -> str:
    """Run (a), (b) and (d) on one fresh embedded broker; a Markdown table."""
    return asyncio.run(_run())


if __name__ == "__main__":
    print(main())
