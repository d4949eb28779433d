"""The gateway process's memory under hostile streams and requests (issue 12): the real
``tokenwire gateway`` as its own process, its own nats-server, the hostile upstream.

RSS is measured with psutil before and during each load and printed (run with ``-s`` to see
the table); the assertions are generous bounds on growth (the issue saw 329 MB -> 3.57 GB from
one stream and 124 MB -> 694 MB from eight 64 MB headers), never timings.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.gateway._helpers import GATEWAY_KEY
from tests.limits.hostile import HostileUpstream
from tokenwire.broker import EmbeddedServer

pytestmark = pytest.mark.slow
MB = 1024 * 1024
GROWTH_BOUND = 300 * MB


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def gateway_process(
    nats_url: str, upstream: str
) -> AsyncIterator[tuple[str, psutil.Process]]:
    port = free_port()
    env = {
        **os.environ,
        "TOKENWIRE_NATS_URL": nats_url,
        "TOKENWIRE_GATEWAY_ADDR": f"127.0.0.1:{port}",
        "TOKENWIRE_GATEWAY_KEYS": GATEWAY_KEY,
        "TOKENWIRE_OPENAI_BASE_URL": f"{upstream}/v1",
        "OPENAI_API_KEY": "sk-hostile",
        "TOKENWIRE_PARTITIONS": "2",
        "TOKENWIRE_GATEWAY_MAX_STEP_SECONDS": "8",
        "TOKENWIRE_GATEWAY_HEADER_TIMEOUT_S": "2",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tokenwire",
        "gateway",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with asyncio.timeout(60), httpx.AsyncClient(base_url=url) as client:
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get("/readyz")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
        yield url, psutil.Process(proc.pid)
    finally:
        proc.terminate()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(30):
                await proc.wait()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def stream_for(url: str, model: str, reads: int) -> None:
    body = {
        "model": f"openai/{model}",
        "stream": True,
        "messages": [{"role": "user", "content": "x"}],
    }
    headers = {"authorization": f"Bearer {GATEWAY_KEY}"}
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:  # noqa: SIM117
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            n = 0
            async for _ in r.aiter_raw():
                n += 1
                if n >= reads:
                    return


async def peak_during(proc: psutil.Process, load: asyncio.Future[Any]) -> int:
    peak = proc.memory_info().rss
    while not load.done():
        peak = max(peak, proc.memory_info().rss)
        await asyncio.sleep(0.05)
    await load
    return max(peak, proc.memory_info().rss)


async def slow_headers(url: str, count: int, each: int) -> int:
    """``count`` connections each sending ``each`` bytes of one header, never ending it;
    returns how many the gateway answered (431) or closed."""
    host, port = url.removeprefix("http://").split(":")

    async def one() -> bool:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nx-big: ")
            sent = 0
            with contextlib.suppress(ConnectionError):
                while sent < each:
                    writer.write(b"a" * MB)
                    await writer.drain()
                    sent += MB
            async with asyncio.timeout(30):
                return (await reader.read()) is not None
        except (ConnectionError, TimeoutError):
            return True
        finally:
            writer.close()

    return sum(await asyncio.gather(*(one() for _ in range(count))))


async def test_gateway_rss_stays_bounded_under_hostile_streams_and_headers(tmp_path: Path):
    rows: list[tuple[str, float, float]] = []
    async with (
        EmbeddedServer(tmp_path / "nats") as nats,
        HostileUpstream(max_seconds=30) as upstream,
        gateway_process(nats.url, upstream.url) as (url, proc),
    ):
        base = proc.memory_info().rss
        loads: dict[str, list[Coroutine[Any, Any, object]]] = {
            "one stream of empty events": [stream_for(url, "empty-events", 20_000)],
            "three endless streams": [stream_for(url, "endless", 20_000) for _ in range(3)],
            "eight 64 MB unfinished headers": [slow_headers(url, 8, 64 * MB)],
            "300 slow-header connections": [slow_headers(url, 300, 0)],
        }
        for name, coros in loads.items():
            before = proc.memory_info().rss
            peak = await peak_during(proc, asyncio.gather(*coros))
            rows.append((name, before / MB, peak / MB))
            assert peak - base < GROWTH_BOUND, (name, before / MB, peak / MB)
    print("\nload | RSS before MB | RSS peak during MB")
    for name, before_mb, peak_mb in rows:
        print(f"{name} | {before_mb:.0f} | {peak_mb:.0f}")
