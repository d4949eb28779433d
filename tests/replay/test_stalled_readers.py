"""Stalled readers of the session events endpoint (issue 30): the real ``tokenwire gateway``
as its own process, over real sockets, on its own nats-server.

50 clients open ``GET /v1/sessions/{s}/events`` on a long session, read a few events, then
stop reading their sockets (each with a 64 KiB receive buffer, so the kernel absorbs little of
the stream for them). The gateway's RSS (psutil) must grow by less than 50 MB while they are
stalled: each reader holds at most its read window and its client queue. With the ordered push
consumer of earlier versions nats-py queued what the server pushed for each of them (~127,000
messages, 52 MB, for one reader of a 400,000-chunk session), and this test failed with a
growth of hundreds of MB. Then every client reads again, reconnecting with
``Last-Event-ID`` after a ``lagged`` event as an EventSource does, and must get every chunk
exactly once, in order: the oracle is the text written into the session here.

The second test is issue 48's: a 20 MB session of long steps, 50 readers stalled in the middle
of a step (half of them resumed there with ``Last-Event-ID``, which renders the step's start
silently). Each reader's renderer kept the text of its open step, ~4 MB a reader (+191 MB for
50); the documented bound is 1 MB a reader (docs/replay.md, "Memory of the events endpoint").
The third is the same bound for a session of emoji in chunk frames (ADR 0024): the client
queue counted events and merged text in characters, and a reader cost ~1.1 MB.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from tests.gateway._helpers import GATEWAY_KEY
from tests.replay.sessions import publish
from tokenwire.broker import (
    EmbeddedServer,
    Topology,
    connect,
    ensure_topology,
    free_port,
    stream_info,
)
from tokenwire.schemas import ChunkEnvelope, Finish, TextDelta

pytestmark = pytest.mark.slow
MB = 1024 * 1024
READERS = 50
STEPS, STEP_CHUNKS = 3, 1_000
GROWTH_BOUND = 50 * MB
PER_READER_BOUND = 1 * MB
"""The documented bound of one stalled reader's gateway memory."""
SESSION = "stalled-readers"
LONG_STEPS, LONG_STEP_CHUNKS = 4, 11_000
"""The large session: 44,000 chunks of ~500 bytes each, ~22 MB retained; steps of ~4 MB."""


FILLER = "a fragment of the long answer, as a provider streams it, word after word; " * 5


def _text(step: int, ordinal: int) -> str:
    return f"[{step}:{ordinal:04d}] {FILLER}"


def _session() -> tuple[list[ChunkEnvelope], str]:
    """The long session and its whole text (the oracle)."""
    out: list[ChunkEnvelope] = []
    for step in range(STEPS):
        for k in range(STEP_CHUNKS):
            chunk = TextDelta(0, _text(step, k)) if k < STEP_CHUNKS - 1 else Finish("stop")
            out.append(
                ChunkEnvelope(
                    SESSION,
                    0,
                    step,
                    k,
                    1_000 + len(out),
                    "scripted",
                    "m",
                    chunk,
                    request_time_ns=0 if k == 0 else None,
                )
            )
    text = "".join(_text(s, k) for s in range(STEPS) for k in range(STEP_CHUNKS - 1))
    return out, text


@contextlib.asynccontextmanager
async def gateway_process(nats_url: str, data: Path) -> AsyncIterator[tuple[str, psutil.Process]]:
    port = free_port()
    env = {
        **os.environ,
        "TOKENWIRE_NATS_URL": nats_url,
        "TOKENWIRE_DATA_DIR": str(data),
        "TOKENWIRE_GATEWAY_ADDR": f"127.0.0.1:{port}",
        "TOKENWIRE_GATEWAY_KEYS": GATEWAY_KEY,
        "TOKENWIRE_PARTITIONS": "2",
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


@dataclass
class Reader:
    """One SSE client on a raw socket: it reads only when told to."""

    port: int
    last_id: int | str | None = None
    """The resume id: a stream seq, or ``seq:index`` inside a frame (ADR 0024)."""
    events: list[dict[str, object]] = field(default_factory=list)
    reconnects: int = 0
    _reader: asyncio.StreamReader | None = None
    _writer: asyncio.StreamWriter | None = None
    _buffer: bytes = b""

    async def connect(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        # Before connect (it sets the window): the kernel absorbs ~100 KB of the stream for a
        # client that stopped reading, not megabytes; 64 KiB still reads at full speed.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.port))
        self._reader, self._writer = await asyncio.open_connection(sock=sock)
        resume = f"last-event-id: {self.last_id}\r\n" if self.last_id is not None else ""
        self._writer.write(
            f"GET /v1/sessions/{SESSION}/events?follow=false HTTP/1.1\r\nhost: gw\r\n"
            f"authorization: Bearer {GATEWAY_KEY}\r\n{resume}\r\n".encode()
        )
        head = await self._reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head[:200]
        assert b"transfer-encoding: chunked" in head.lower()
        self._buffer = b""

    async def read_events(self, count: int | None) -> str:
        """Read ``count`` chunk events (None: to the end); 'more', 'end' or 'lagged'."""
        got = 0
        while count is None or got < count:
            frame = await self._frame()
            if frame is None:
                return "end"
            kind, data, event_id = frame
            if kind == "lagged":
                return "lagged"
            if kind == "chunk":
                assert data is not None
                self.events.append(data)
                self.last_id = event_id or 0
                got += 1
            elif kind == "error":
                raise AssertionError(f"the read failed: {data}")
        return "more"

    async def _frame(self) -> tuple[str, dict[str, object] | None, str | None] | None:
        while b"\n\n" not in self._buffer:
            piece = await self._chunk()
            if piece is None:
                return None
            self._buffer += piece
        raw, self._buffer = self._buffer.split(b"\n\n", 1)
        kind, data, event_id = "message", None, None
        for line in raw.decode().split("\n"):
            name, _, value = line.partition(": ")
            if name == "event":
                kind = value
            elif name == "data":
                data = json.loads(value)
            elif name == "id":
                event_id = value
        return (
            (kind, data, event_id) if (data is not None or kind != "message") else ("", None, None)
        )

    async def _chunk(self) -> bytes | None:
        """One piece of the chunked body; None at its end."""
        assert self._reader is not None
        size = int((await self._reader.readuntil(b"\r\n")).strip(), 16)
        if size == 0:
            await self._reader.readuntil(b"\r\n")
            return None
        piece = await self._reader.readexactly(size + 2)
        return piece[:-2]

    async def read_to_the_end(self) -> None:
        """Everything left, reconnecting after ``lagged`` from the last id (an EventSource)."""
        while await self.read_events(None) == "lagged":
            await self.close()
            self.reconnects += 1
            await self.connect()
        await self.close()

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(ConnectionError):
                await self._writer.wait_closed()
            self._writer = None


async def _settled_peak(proc: psutil.Process, bound_s: float = 30.0) -> int:
    """The peak RSS until it stops growing (no new peak for 2 s; at most ``bound_s``)."""
    peak = proc.memory_info().rss
    quiet = 0.0
    for _ in range(int(bound_s / 0.1)):
        await asyncio.sleep(0.1)
        rss = proc.memory_info().rss
        if rss > peak + MB:
            quiet = 0.0
        else:
            quiet += 0.1
        peak = max(peak, rss)
        if quiet >= 2.0:
            break
    return peak


def _check(reader: Reader, total: int, text: str) -> None:
    """Every chunk once, in order: ids rising, each event standing for itself and what it
    coalesced, the shown text equal to the session's."""
    events: list[Any] = reader.events
    ids = [e["seq"] for e in events]
    assert ids == sorted(set(ids)), "an event repeated or out of order"
    assert ids[-1] == total
    assert sum(1 + e["coalesced"] for e in events) == total
    shown = "".join(s["text"] for e in events for s in e["shown"] if s["type"] == "text")
    assert shown == text


async def test_50_stalled_readers_hold_little_and_then_get_every_event_once(tmp_path: Path):
    sent, text = _session()
    async with EmbeddedServer(tmp_path / "nats") as nats:
        nc = await connect(nats.url)
        try:
            topology = Topology(partitions=2)
            await ensure_topology(nc, topology)
            await publish(nc, topology, sent)
        finally:
            await nc.close()
        async with gateway_process(nats.url, tmp_path / "data") as (url, proc):
            port = int(url.rsplit(":", 1)[1])
            warm = Reader(port)  # the first read pays imports and caches: not the readers' cost
            await warm.connect()
            await warm.read_to_the_end()
            _check(warm, len(sent), text)
            base = proc.memory_info().rss

            readers = [Reader(port) for _ in range(READERS)]

            async def read_a_little(reader: Reader) -> str:
                await reader.connect()
                return await reader.read_events(3)

            assert await asyncio.gather(*map(read_a_little, readers)) == ["more"] * READERS
            peak = await _settled_peak(proc)  # every reader stopped reading its socket
            print(
                f"\ngateway RSS: {base / MB:.0f} MB before, {peak / MB:.0f} MB peak while "
                f"{READERS} readers stalled (+{(peak - base) / MB:.1f} MB)"
            )
            assert peak - base < GROWTH_BOUND

            async with asyncio.timeout(240):
                await asyncio.gather(*(r.read_to_the_end() for r in readers))
            for reader in readers:
                _check(reader, len(sent), text)
            print(f"reconnects after lagged: {sum(r.reconnects for r in readers)}")


def _long_session() -> list[ChunkEnvelope]:
    out: list[ChunkEnvelope] = []
    for step in range(LONG_STEPS):
        for k in range(LONG_STEP_CHUNKS):
            chunk = TextDelta(0, _text(step, k)) if k < LONG_STEP_CHUNKS - 1 else Finish("stop")
            out.append(
                ChunkEnvelope(
                    SESSION,
                    0,
                    step,
                    k,
                    1_000 + len(out),
                    "scripted",
                    "m",
                    chunk,
                    request_time_ns=0 if k == 0 else None,
                )
            )
    return out


async def test_50_stalled_readers_of_a_20_mb_session_stay_under_the_documented_bound(
    tmp_path: Path,
) -> None:
    sent = _long_session()
    async with EmbeddedServer(tmp_path / "nats") as nats:
        nc = await connect(nats.url)
        try:
            topology = Topology(partitions=2)
            await ensure_topology(nc, topology)
            await publish(nc, topology, sent)
            retained = int((await stream_info(nc, topology.stream))["state"]["bytes"])
        finally:
            await nc.close()
        assert retained > 20 * MB
        async with gateway_process(nats.url, tmp_path / "data") as (url, proc):
            port = int(url.rsplit(":", 1)[1])
            warm = Reader(port, last_id=len(sent) - 100)  # imports and caches: not a reader's
            await warm.connect()
            await warm.read_to_the_end()
            base = proc.memory_info().rss

            # Half read from the start, half resume deep inside the third step (~3 MB of it
            # rendered silently first); each reads a few events, then stops reading.
            middle = 2 * LONG_STEP_CHUNKS + 7_000
            readers = [Reader(port, last_id=middle if i % 2 else None) for i in range(READERS)]

            async def read_a_little(reader: Reader) -> str:
                await reader.connect()
                return await reader.read_events(3)

            assert await asyncio.gather(*map(read_a_little, readers)) == ["more"] * READERS
            peak = await _settled_peak(proc)
            for reader in readers:
                await reader.close()
    growth = peak - base
    print(
        f"\n{retained / MB:.1f} MB session, {READERS} stalled readers: gateway RSS "
        f"+{growth / MB:.1f} MB ({growth / READERS / MB:.2f} MB a reader)"
    )
    assert growth < READERS * PER_READER_BOUND


EMOJI = "\U0001f600\U0001f680\U0001f389\U0001f4a1\U0001f525\u2728\U0001f30d\U0001f3b5" * 2
"""16 characters, 62 bytes of UTF-8, 4 bytes a character in CPython: each chunk's text."""
EMOJI_STEP_CHUNKS, EMOJI_FRAME = 51_000, 1_000


def _emoji_session() -> list[ChunkEnvelope]:
    out: list[ChunkEnvelope] = []
    for step in range(LONG_STEPS):
        for k in range(EMOJI_STEP_CHUNKS):
            last = k == EMOJI_STEP_CHUNKS - 1
            chunk = Finish("stop") if last else TextDelta(0, EMOJI)
            out.append(
                ChunkEnvelope(
                    SESSION,
                    0,
                    step,
                    k,
                    1_000 + len(out),
                    "scripted",
                    "m",
                    chunk,
                    request_time_ns=0 if k == 0 else None,
                )
            )
    return out


async def test_50_stalled_readers_of_a_20_mb_session_of_emoji_frames_stay_under_the_bound(
    tmp_path: Path,
) -> None:
    """Multi-byte text in frames of 1,000 chunks: the bound holds in bytes whatever the text."""
    sent = _emoji_session()
    async with EmbeddedServer(tmp_path / "nats") as nats:
        nc = await connect(nats.url)
        try:
            topology = Topology(partitions=2)
            await ensure_topology(nc, topology)
            messages = await publish(nc, topology, sent, frame_size=EMOJI_FRAME)
            retained = int((await stream_info(nc, topology.stream))["state"]["bytes"])
        finally:
            await nc.close()
        assert retained > 20 * MB
        async with gateway_process(nats.url, tmp_path / "data") as (url, proc):
            port = int(url.rsplit(":", 1)[1])
            warm = Reader(port, last_id=messages - 2)  # imports and caches: not a reader's
            await warm.connect()
            await warm.read_to_the_end()
            base = proc.memory_info().rss
            # Half from the start, half resumed two thirds into the third step's frames.
            middle = messages // 2 + messages // 6
            readers = [Reader(port, last_id=middle if i % 2 else None) for i in range(READERS)]

            async def read_a_little(reader: Reader) -> str:
                await reader.connect()
                return await reader.read_events(3)

            assert await asyncio.gather(*map(read_a_little, readers)) == ["more"] * READERS
            peak = await _settled_peak(proc)
            for reader in readers:
                await reader.close()
    growth = peak - base
    print(
        f"\n{retained / MB:.1f} MB session of emoji in {messages} messages, {READERS} stalled "
        f"readers: gateway RSS +{growth / MB:.1f} MB ({growth / READERS / MB:.2f} MB a reader)"
    )
    assert growth < READERS * PER_READER_BOUND
