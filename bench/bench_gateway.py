"""The gateway on one embedded nats-server, against the publish limit and the direct call.

(a) the limit: raw pipelined JetStream publish with acks through nats-py's public API (core
    publish with a reply subject, ``Nats-Msg-Id`` and trace headers, every ack counted in a
    callback, nothing else), gateway-sized envelopes, in this process, plus its CPU per chunk;
(a') ``ChunkPublisher`` (the gateway's publisher: window, retries, per-step acks) the same way;
(b) the gateway (its own process, uvicorn + httptools on uvloop, as ``gateway.main`` runs it)
    with 200 concurrent streaming sessions from the scripted provider (its own process) at
    full speed: chunks published per second from the first request to the last response
    (each response ends only after its acks), and the gateway process's own CPU per chunk,
    which gives its one-core ceiling; with short answers (100 fragments, where the requests'
    own work and the rounds' ramp-up and ramp-down weigh) and long ones (500 fragments);
(b2) the same loads dealt between two gateway processes on the same broker (as docker-compose
    deploys them behind nginx): what the gateway tier does with the CPU one process leaves;
(b0) the same load sent to the scripted provider directly: the upstream's own ceiling;
(d) added time to first chunk (first body bytes): 50 sessions at once, each sending requests
    one after another, alternating direct and through the gateway, with the provider pacing
    fragments at a realistic 50/s so the CPU is not saturated; p50/p99 of the per-pair
    difference (gateway - direct) and of each side;
(d1) the same pairs one at a time (no concurrency at all);
(d0) the floor of any Python gateway: (d) and (d1) through a bare streaming proxy (uvicorn +
    httptools on uvloop, aiohttp to the provider, bytes passed through; no checks, no broker),
    so the gateway's own share of the added time is visible;
(e) the provider client alone (ADR 0009): time to the first body bytes of a scripted stream
    through aiohttp and through tokenwire's HttpClient, alternating, 20 callers at once in this
    process (keep-alive connections, the same request).

The latency rows run first, on a quiet broker: after the load rounds the broker is still
writing ~150k messages out for a while, which would be measured as the gateway's latency.

The load generator is a raw HTTP/1.1 client on uvloop (one pre-encoded request, bytes counted,
nothing parsed but the header end and the last chunk), so that on these 2 shared cores it
costs a fraction of the gateway's CPU; the CPU of every process is measured and reported.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import msgspec
import psutil
import uvloop

from bench.bench_publish import raw_pipeline
from tokenwire.broker import (
    ChunkPublisher,
    EmbeddedServer,
    Topology,
    connect,
    ensure_topology,
    free_port,
)
from tokenwire.providers import HttpClient
from tokenwire.schemas import ChunkEnvelope, TextDelta, json_encoder

SESSIONS_B = 200
FRAGMENTS_B = 100
FRAGMENTS_LONG = 500
ROUNDS_B = 3
SESSIONS_D = 50
PAIRS_D = 20  # per session
SERIAL_D = 100
CALLERS_E = 20
REQUESTS_E = 50  # per caller and client
RATE_D = 50  # fragments per second, a fast model's pace
N_A = 60_000
ENVELOPE = json_encoder.encode(
    ChunkEnvelope(
        "bench-session-000", 0, 0, 17, time.time_ns(), "scripted", "text", TextDelta(0, "abcd")
    )
)
TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}

_SCRIPTED = """
import sys, uvloop
from tokenwire.services.scripted_provider import ScriptedSettings, serve
uvloop.run(serve("127.0.0.1", int(sys.argv[1]), ScriptedSettings(length=int(sys.argv[2]))))
"""
_GATEWAY = """
import sys
from tokenwire.services.gateway import GatewaySettings, main
env = {"TOKENWIRE_SCRIPTED_BASE_URL": sys.argv[3]}
main(GatewaySettings(port=int(sys.argv[1]), nats_url=sys.argv[2], provider_env=env))
"""
_PROXY = """
import socket, sys, aiohttp, uvicorn, uvloop
upstream = f"http://127.0.0.1:{sys.argv[2]}/v1/chat/completions"
state = {}
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body, more = b"", True
    while more:
        message = await receive()
        body, more = body + message.get("body", b""), message.get("more_body", False)
    if scope["path"] == "/healthz":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    if "session" not in state:
        state["session"] = aiohttp.ClientSession()
    headers = {"content-type": "application/json"}
    async with state["session"].post(upstream, data=body, headers=headers) as r:
        head = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": r.status, "headers": head})
        async for piece in r.content.iter_any():
            await send({"type": "http.response.body", "body": piece, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
sock = socket.socket()
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.listen(2048)
config = uvicorn.Config(app, http="httptools", log_level="warning", lifespan="off")
uvloop.run(uvicorn.Server(config).serve(sockets=[sock]))
"""


def _cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return times.user + times.system


# -- the load generator -------------------------------------------------------------------


class Caller:
    """One keep-alive HTTP/1.1 connection sending one pre-encoded streaming request at a time."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, port: int) -> Caller:
        """Connect to ``127.0.0.1:port`` (TCP_NODELAY is uvloop's default)."""
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def stream(self, request: bytes) -> tuple[float, int]:
        """Send ``request``; return (seconds to the first body bytes, bytes received)."""
        started = time.perf_counter()
        self.writer.write(request)
        buf = b""
        while (head_end := buf.find(b"\r\n\r\n")) < 0:
            buf += await self._read()
        if not buf.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"not streamed: {buf[:600]!r}")
        body, size = buf[head_end + 4 :], len(buf)
        while not body:
            body = await self._read()
            size += len(body)
        first = time.perf_counter() - started
        tail = body[-7:]
        while not tail.endswith(b"\r\n0\r\n\r\n"):  # chunked encoding's last chunk
            data = await self._read()
            size += len(data)
            tail = tail[-7:] + data
        return first, size

    async def _read(self) -> bytes:
        data = await self.reader.read(262144)
        if not data:
            raise RuntimeError("connection closed mid-response")
        return data

    def close(self) -> None:
        self.writer.close()


def streaming_request(port: int, path: str, session: str, options: str, extra: str = "") -> bytes:
    """A pre-encoded chat completion request for ``scripted/text?<options>``; ``extra``: more
    header lines (each ending ``\r\n``)."""
    body = msgspec.json.encode(
        {
            "model": f"scripted/text?{options}",
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
    )
    head = (
        f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
        f"x-tokenwire-session: {session}\r\n{extra}content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def paced_sessions(
    port: int, sessions: int, tag: str, *, steps: int, tokens: int, rate: int, extra: str = ""
) -> None:
    """``sessions`` keep-alive callers, each streaming ``steps`` steps of ``tokens`` tokens at
    ``rate`` tokens/s one after another (the scripted provider paces them), the starts spread
    over a second: the capacity model's load. ``extra``: more request header lines."""
    options = f"fragments={tokens}&rate={rate}"

    async def one(i: int) -> None:
        await asyncio.sleep(i / sessions)
        caller = await Caller.open(port)
        try:
            for k in range(steps):
                path, session = "/v1/chat/completions", f"{tag}-{i}-{k}"
                await caller.stream(streaming_request(port, path, session, options, extra))
        finally:
            caller.close()

    await asyncio.gather(*(one(i) for i in range(sessions)))


Counter = Callable[[], Awaitable[int]]


# -- (a) ------------------------------------------------------------------------------------


async def bench_publish_limit(url: str) -> tuple[float, float]:
    """(a) chunks/s of raw pipelined publishes with acks counted in a callback; CPU us/chunk."""
    nc = await connect(url)
    t = _bench_topology("raw")
    await ensure_topology(nc, t)
    result = await raw_pipeline(
        nc, t, ENVELOPE, n=N_A, sessions=SESSIONS_B, headers=TRACE, mark_first=True
    )
    await nc.close()
    return result


async def bench_chunk_publisher(url: str) -> tuple[float, float]:
    """(a') chunks/s of the broker package's publisher, acks included; and its CPU us/chunk."""
    nc = await connect(url)
    t = _bench_topology("pub")
    await ensure_topology(nc, t)
    publisher = await ChunkPublisher(nc, t).start()
    cpu, started = time.process_time(), time.perf_counter()
    for i in range(N_A):
        session, ordinal = f"s{i % SESSIONS_B}", i // SESSIONS_B
        await publisher.publish(ENVELOPE, session, 0, 0, ordinal, first=ordinal == 0, headers=TRACE)
    await publisher.flush(60)
    rate = N_A / (time.perf_counter() - started)
    cpu_us = (time.process_time() - cpu) / N_A * 1e6
    await publisher.close()
    await nc.close()
    return rate, cpu_us


def _bench_topology(tag: str) -> Topology:
    up = tag.upper()
    return Topology(
        prefix=f"bench{tag}",
        stream=f"BENCH{up}",
        events_stream=f"BENCHE{up}",
        dlq_stream=f"BENCHD{up}",
        steps_bucket=f"bench-{tag}-steps",
        partitions=16,
        max_bytes=1024**3,
    )


# -- (b), (b0) ------------------------------------------------------------------------------


@dataclass
class Load:
    """One measured round of the 200-session load."""

    seconds: float
    units: int  # chunks published (gateway) or events streamed (direct)
    cpu: dict[str, float]  # CPU seconds per process during the round

    @property
    def rate(self) -> float:
        """Units per second."""
        return self.units / self.seconds

    def us_per_unit(self, *names: str) -> float:
        """CPU microseconds of the processes ``names`` together per unit."""
        return sum(self.cpu[name] for name in names) / self.units * 1e6


async def _round(
    ports: list[int], tag: str, procs: dict[str, psutil.Process], fragments: int = FRAGMENTS_B
) -> tuple[float, dict[str, float]]:
    """One round of 200 sessions, dealt round-robin over ``ports`` (as a load balancer would)."""
    at = [ports[i % len(ports)] for i in range(SESSIONS_B)]
    callers = await asyncio.gather(*(Caller.open(port) for port in at))
    requests = [
        streaming_request(port, "/v1/chat/completions", f"{tag}-{i}", f"fragments={fragments}")
        for i, port in enumerate(at)
    ]
    before = {name: _cpu_s(p) for name, p in procs.items()}
    started = time.perf_counter()
    await asyncio.gather(*(c.stream(r) for c, r in zip(callers, requests, strict=True)))
    elapsed = time.perf_counter() - started
    cpu = {name: _cpu_s(p) - before[name] for name, p in procs.items()}
    for caller in callers:
        caller.close()
    return elapsed, cpu


async def bench_load(
    ports: list[int],
    tag: str,
    procs: dict[str, psutil.Process],
    counted: Counter | None,
    fragments: int = FRAGMENTS_B,
) -> Load:
    """The best of ``ROUNDS_B`` rounds (after a warm-up) of 200 sessions streaming at once.

    ``counted`` gives the chunks in the broker (the gateway's units); without it a round's
    units are the events the provider streams.
    """
    await _round(ports, f"{tag}-warm", procs, fragments)
    best: Load | None = None
    for r in range(ROUNDS_B):
        before = await counted() if counted else 0
        elapsed, cpu = await _round(ports, f"{tag}-{r}", procs, fragments)
        units = await counted() - before if counted else SESSIONS_B * (fragments + 4)
        load = Load(elapsed, units, cpu)  # events: text deltas + role, finish, usage, [DONE]
        best = load if best is None or load.rate > best.rate else best
    assert best is not None
    return best


async def _stream_count(url: str) -> int:
    nc = await connect(url)
    info = await nc.jetstream().stream_info("TOKENWIRE")
    await nc.close()
    return int(info.state.messages)


# -- (d), (d1) ------------------------------------------------------------------------------


async def _pairs(
    sp_port: int, gw_port: int, session: str, n: int, delay_s: float, options: str
) -> list[tuple[float, float]]:
    """``n`` (direct, gateway) time-to-first-chunk pairs, one request after another, after a
    warm-up pair (new connections) and ``delay_s``; a random pause between pairs keeps the
    sessions from arriving in lock-step (which would measure queueing, not the gateway)."""
    direct, through = await Caller.open(sp_port), await Caller.open(gw_port)
    path = "/v1/chat/completions"
    pause = random.Random(session)
    pairs = []
    await asyncio.sleep(delay_s)
    for i in range(n + 1):
        d, _ = await direct.stream(streaming_request(sp_port, path, f"{session}-d{i}", options))
        g, _ = await through.stream(streaming_request(gw_port, path, session, options))
        if i:
            pairs.append((d, g))
        await asyncio.sleep(pause.uniform(0, 0.05))
    direct.close()
    through.close()
    return pairs


async def bench_ttfc(
    sp_port: int, gw_port: int, sessions: int, n: int, first_token_s: float = 0.0
) -> list[tuple[float, float]]:
    """(d) with ``sessions`` concurrent sessions (starts spread over one request's length),
    (d1) with one; ``first_token_s``: the provider's time to first token (scripted ``first``)."""
    spread = 8 / RATE_D / sessions
    options = f"fragments=8&rate={RATE_D}" + (f"&first={first_token_s}" if first_token_s else "")
    results = await asyncio.gather(
        *(
            _pairs(sp_port, gw_port, f"ttfc-{sessions}-{s}", n, s * spread, options)
            for s in range(sessions)
        )
    )
    return [pair for pairs in results for pair in pairs]


# -- (e) ------------------------------------------------------------------------------------


async def bench_clients(sp_port: int) -> tuple[list[float], list[float]]:
    """(e) seconds to the first body bytes: (aiohttp, HttpClient), alternating per caller."""
    url = f"http://127.0.0.1:{sp_port}/v1/chat/completions"
    body = msgspec.json.encode(
        {
            "model": f"text?fragments=8&rate={RATE_D}",
            "stream": True,
            "messages": [{"role": "user", "content": "hi"}],
        }
    )
    headers = {"content-type": "application/json"}
    times: tuple[list[float], list[float]] = ([], [])
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    client = HttpClient(proxies={})

    async def with_aiohttp() -> float:
        started = time.perf_counter()
        async with session.post(url, data=body, headers=headers) as response:
            await response.content.readany()
            first = time.perf_counter() - started
            await response.read()
        return first

    async def with_ours() -> float:
        started = time.perf_counter()
        response = await client.post(url, body, headers)
        await response.read()
        first = time.perf_counter() - started
        while await response.read():
            pass
        response.release()
        return first

    async def caller(seed: int) -> None:
        pause = random.Random(seed)
        for i in range(REQUESTS_E + 1):
            a, b = await with_aiohttp(), await with_ours()
            if i:  # the first pair opens the connections
                times[0].append(a)
                times[1].append(b)
            await asyncio.sleep(pause.uniform(0, 0.05))

    try:
        await asyncio.gather(*(caller(seed) for seed in range(CALLERS_E)))
    finally:
        await session.close()
        await client.close()
    return times


# -- the run and the table ------------------------------------------------------------------


def _spawn(code: str, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def _wait_up(port: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
            ok = (await reader.read(64)).startswith(b"HTTP/1.1 200")
            writer.close()
            if ok:
                return
        except OSError:
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"port {port} did not come up")


@dataclass
class Results:
    """Everything the table shows."""

    limit: float
    limit_cpu_us: float
    publisher: float
    publisher_cpu_us: float
    direct: Load
    gateway: Load
    gateway_long: Load
    pair: Load
    pair_long: Load
    ttfc: list[tuple[float, float]]
    serial: list[tuple[float, float]]
    floor: list[tuple[float, float]]
    floor_serial: list[tuple[float, float]]
    clients: tuple[list[float], list[float]]


async def _run() -> Results:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer(Path(tmp))
        server.start()
        sp_port, gw_port, gw2_port, px_port = free_port(), free_port(), free_port(), free_port()
        upstream = f"http://127.0.0.1:{sp_port}"
        scripted = _spawn(_SCRIPTED, str(sp_port), str(FRAGMENTS_B))
        gateway = _spawn(_GATEWAY, str(gw_port), server.url, upstream)
        gateway2 = _spawn(_GATEWAY, str(gw2_port), server.url, upstream)
        proxy = _spawn(_PROXY, str(px_port), str(sp_port))
        try:
            for port in (sp_port, gw_port, gw2_port, px_port):
                await _wait_up(port)
            me = psutil.Process()
            procs = {
                "gateway": psutil.Process(gateway.pid),
                "gateway2": psutil.Process(gateway2.pid),
                "scripted": psutil.Process(scripted.pid),
                "load": me,
                "nats": next(p for p in me.children() if p.name() == "nats-server"),
            }
            # Latency first, on a quiet broker: after the load rounds it is still writing
            # their ~150k messages out, which would be measured as the gateway's latency.
            ttfc = await bench_ttfc(sp_port, gw_port, SESSIONS_D, PAIRS_D)
            serial = await bench_ttfc(sp_port, gw_port, 1, SERIAL_D)
            floor = await bench_ttfc(sp_port, px_port, SESSIONS_D, PAIRS_D)
            floor_serial = await bench_ttfc(sp_port, px_port, 1, SERIAL_D)
            clients = await bench_clients(sp_port)
            limit, limit_cpu = await bench_publish_limit(server.url)
            publisher, publisher_cpu = await bench_chunk_publisher(server.url)
            direct = await bench_load([sp_port], "b0", procs, None)
            count = functools.partial(_stream_count, server.url)
            gw = await bench_load([gw_port], "b", procs, count)
            gw_long = await bench_load([gw_port], "bl", procs, count, FRAGMENTS_LONG)
            pair = await bench_load([gw_port, gw2_port], "b2", procs, count)
            pair_long = await bench_load([gw_port, gw2_port], "b2l", procs, count, FRAGMENTS_LONG)
        finally:
            for proc in (gateway, gateway2, scripted, proxy):
                proc.terminate()
                proc.wait(10)
            server.stop()
    return Results(
        limit,
        limit_cpu,
        publisher,
        publisher_cpu,
        direct,
        gw,
        gw_long,
        pair,
        pair_long,
        ttfc,
        serial,
        floor,
        floor_serial,
        clients,
    )


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _table(r: Results) -> str:
    direct = r.direct
    limit_ceiling = 1e6 / r.limit_cpu_us
    sp_ceiling = 1e6 / direct.us_per_unit("scripted")
    rows = [
        "| measure | baseline | gateway | ratio / added | target |",
        "| --- | --- | --- | --- | --- |",
        *_load_rows(r, r.gateway, FRAGMENTS_B),
        *_load_rows(r, r.gateway_long, FRAGMENTS_LONG),
        *_pair_rows(r, r.pair, FRAGMENTS_B),
        *_pair_rows(r, r.pair_long, FRAGMENTS_LONG),
        f"| (b0)/(b) vs the scripted provider alone, events/s | {direct.rate:,.0f} (direct) "
        f"| {r.gateway.rate:,.0f} | {r.gateway.rate / direct.rate:.2f}x | |",
        f"| (b0) scripted provider CPU per event, us (its ceiling, events/s) "
        f"| {direct.us_per_unit('scripted'):.1f} ({sp_ceiling:,.0f}) | | | |",
        f"| (a) raw pipelined publish CPU per chunk, us (its one-core ceiling, chunks/s) "
        f"| {r.limit_cpu_us:.1f} ({limit_ceiling:,.0f}) | | | |",
        f"| (a') ChunkPublisher alone: chunks/s, CPU per chunk us | {r.limit:,.0f} (a) "
        f"| {r.publisher:,.0f}, {r.publisher_cpu_us:.1f} us | {r.publisher / r.limit:.2f}x | |",
    ]
    label = f"(d) {SESSIONS_D} sessions at once, {RATE_D} fragments/s"
    return "\n".join(
        [
            *rows,
            *_ttfc_rows(label, r.ttfc),
            *_ttfc_rows("(d1) one at a time", r.serial),
            *_ttfc_rows("(d0) bare proxy, " + label[4:], r.floor, "bare proxy"),
            *_ttfc_rows("(d0) bare proxy, one at a time", r.floor_serial, "bare proxy"),
            *_client_rows(r.clients),
        ]
    )


def _client_rows(clients: tuple[list[float], list[float]]) -> list[str]:
    label = f"(e) provider client alone, {CALLERS_E} callers: first body bytes"
    aio, ours = ([t * 1000.0 for t in side] for side in clients)
    return [
        f"| {label} p{q}, ms | {_pct(aio, q / 100):.2f} (aiohttp) | {_pct(ours, q / 100):.2f} "
        f"(HttpClient) | {_pct(ours, q / 100) - _pct(aio, q / 100):+.2f} ms | |"
        for q in (50, 99)
    ]


def _load_rows(r: Results, gw: Load, fragments: int) -> list[str]:
    us = gw.us_per_unit("gateway")
    ceiling, limit_ceiling = 1e6 / us, 1e6 / r.limit_cpu_us
    label = f"(b) {SESSIONS_B} sessions x {fragments} fragments"
    return [
        f"| {label}: chunks/s published with acks, end to end | {r.limit:,.0f} (a: raw "
        f"pipelined publish) | {gw.rate:,.0f} ({gw.units:,} chunks) "
        f"| {gw.rate / r.limit:.2f}x | >= 0.5x |",
        f"| {label}: CPU per chunk in its own process, us | {r.limit_cpu_us:.1f} (raw loop) "
        f"| {us:.1f} (gateway process) | {us / r.limit_cpu_us:.1f}x the CPU | |",
        f"| {label}: one-core ceiling, chunks/s (1 / CPU per chunk) | {limit_ceiling:,.0f} "
        f"| {ceiling:,.0f} | {ceiling / limit_ceiling:.2f}x | |",
        f"| {label}: CPU s in the round, gateway / provider / load generator / nats "
        f"| | {gw.cpu['gateway']:.2f} / {gw.cpu['scripted']:.2f} / {gw.cpu['load']:.2f} "
        f"/ {gw.cpu['nats']:.2f} in {gw.seconds:.2f} s wall | | |",
    ]


def _pair_rows(r: Results, pair: Load, fragments: int) -> list[str]:
    label = f"(b2) two gateway processes, sessions dealt between them, x {fragments} fragments"
    us = pair.us_per_unit("gateway", "gateway2")
    return [
        f"| {label}: chunks/s end to end | {r.limit:,.0f} (a) | {pair.rate:,.0f} "
        f"| {pair.rate / r.limit:.2f}x | |",
        f"| {label}: CPU per chunk of both gateways, us | | {us:.1f} | | |",
    ]


def _ttfc_rows(label: str, pairs: list[tuple[float, float]], via: str = "gateway") -> list[str]:
    ms = 1000.0
    direct = [d * ms for d, _ in pairs]
    through = [g * ms for _, g in pairs]
    added = [(g - d) * ms for d, g in pairs]
    goal = ("<= +1 ms", "<= +5 ms") if via == "gateway" else ("(the floor)", "(the floor)")
    return [
        f"| {label}: time to first chunk p50, ms | {_pct(direct, 0.5):.2f} (direct) "
        f"| {_pct(through, 0.5):.2f} ({via}) | {_pct(added, 0.5):+.2f} ms (per pair) | {goal[0]} |",
        f"| {label}: time to first chunk p99, ms | {_pct(direct, 0.99):.2f} (direct) "
        f"| {_pct(through, 0.99):.2f} ({via}) | {_pct(added, 0.99):+.2f} ms (per pair) "
        f"| {goal[1]} |",
        f"| {label}: pairs | {len(pairs)} | | mean {statistics.mean(added):+.2f} ms | |",
    ]


def main() -> str:
    """Run (a), (b), (b0), (d), (d1), (d0) and (e) on one fresh embedded broker; a table."""
    return _table(uvloop.run(_run()))


if __name__ == "__main__":
    print(main())
