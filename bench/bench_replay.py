"""Replay throughput: ``read_session`` (``tokenwire replay --max`` without printing) against the
raw read it is built on, nats-py's ordered consumer with a callback that only counts, on the
same 1,000,000-chunk session in the same run.

Also shown: ``session_batches`` alone (the bounded pull read under replay, no decode) against
the same raw push read, which is what the bound costs in rate; ``tokenwire.broker.SessionReader``
on the first 200,000 chunks; and what one reader that stopped taking holds: nats-py's ordered
push consumer with a callback that waits (what every read used before issue 30) against the
bounded read (its window). Target: read_session at least half the raw rate.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from nats.aio.client import Client
from nats.aio.msg import Msg

from tokenwire.broker import (
    ChunkPublisher,
    EmbeddedServer,
    SessionReader,
    Topology,
    connect,
    ensure_topology,
    session_batches,
)
from tokenwire.broker._batches import session_read
from tokenwire.replay import read_session
from tokenwire.schemas import ChunkEnvelope, Finish, TextDelta, json_encoder

N = 1_000_000
STEP_CHUNKS = 1_000
N_SESSION_READER = 200_000
SESSION = "bench-replay"
FIGURES: dict[str, float] = {}  # the last run's figures, for the suite (bench/_suite.py)
WORDS = ("the ", "quick ", "brown ", "fox ", "jumps ", "over ", "a ", "lazy ", "dog. ")


def _topology() -> Topology:
    return Topology(
        prefix="br",
        stream="BR",
        events_stream="BRE",
        dlq_stream="BRD",
        steps_bucket="br-steps",
        partitions=1,
        max_bytes=4 * 1024**3,
    )


def _payload(i: int, t0: int) -> tuple[bytes, int, int, int]:
    turn, ordinal = divmod(i, STEP_CHUNKS)
    chunk = Finish("stop") if ordinal == STEP_CHUNKS - 1 else TextDelta(0, WORDS[i % len(WORDS)])
    env = ChunkEnvelope(
        SESSION,
        turn,
        0,
        ordinal,
        t0 + i * 1_000_000,
        "scripted",
        "text",
        chunk,
        request_time_ns=t0 if ordinal == 0 else None,
    )
    return json_encoder.encode(env), turn, 0, ordinal


async def _publish(nc: Client, t: Topology) -> float:
    publisher = await ChunkPublisher(nc, t, window=4096).start()
    t0 = time.time_ns()
    started = time.perf_counter()
    for i in range(N):
        payload, turn, step, ordinal = _payload(i, t0)
        await publisher.publish(payload, SESSION, turn, step, ordinal, first=ordinal == 0)
    await publisher.flush(120)
    await publisher.close()
    return N / (time.perf_counter() - started)


async def _raw(nc: Client, t: Topology) -> float:
    done = asyncio.Event()
    count = 0

    async def on_msg(msg: Msg) -> None:
        nonlocal count
        count += 1
        if count == N:
            done.set()

    started = time.perf_counter()
    sub = await nc.jetstream().subscribe(
        t.session_filter(SESSION), stream=t.stream, ordered_consumer=True, cb=on_msg
    )
    await asyncio.wait_for(done.wait(), 300)
    rate = N / (time.perf_counter() - started)
    await sub.unsubscribe()
    return rate


async def _replay(nc: Client, t: Topology) -> float:
    count = 0
    started = time.perf_counter()
    async for _ in read_session(nc, t, SESSION):
        count += 1
    rate = count / (time.perf_counter() - started)
    if count != N:
        raise RuntimeError(f"read_session saw {count} chunks, expected {N}")
    return rate


async def _batches(nc: Client, t: Topology) -> float:
    count = 0
    started = time.perf_counter()
    async for batch in session_batches(nc, t, SESSION):
        count += len(batch)
    if count != N:
        raise RuntimeError(f"session_batches saw {count} chunks, expected {N}")
    return count / (time.perf_counter() - started)


async def _settled(held: Callable[[], Awaitable[int]], bound_s: float = 10.0) -> int:
    """``held()`` once it stopped growing (sampled every 0.2 s, at most ``bound_s``)."""
    last = -1
    for _ in range(int(bound_s / 0.2)):
        await asyncio.sleep(0.2)
        now = await held()
        if now == last:
            break
        last = now
    return last


async def _stalled_push(nc: Client, t: Topology) -> tuple[int, int]:
    """Messages and bytes nats-py holds for an ordered push reader whose callback waits."""
    stop = asyncio.Event()

    async def on_msg(msg: Msg) -> None:
        await stop.wait()  # the reader stopped taking

    sub = await nc.jetstream().subscribe(
        t.session_filter(SESSION), stream=t.stream, ordered_consumer=True, cb=on_msg
    )

    async def held() -> int:
        return sub.pending_msgs

    msgs = await _settled(held)
    size = sub.pending_bytes
    stop.set()
    await sub.unsubscribe()
    return msgs, size


async def _stalled_bounded(nc: Client, t: Topology) -> tuple[int, int]:
    """Messages requested by a bounded read (and delivered to it) beyond what its caller took,
    as the server counts its deliveries, and their bytes (our side's count)."""
    read = session_read(nc, t, SESSION, None, None)
    await read.open()
    try:
        taken = len(await read.take(10.0))

        async def held() -> int:
            info = await nc.jetstream().consumer_info(t.stream, read._name.decode())
            return int(info.delivered.consumer_seq or 0) - taken

        return await _settled(held), read._item_bytes
    finally:
        await read.close()


async def _session_reader(nc: Client, t: Topology) -> float:
    count = 0
    started = time.perf_counter()
    reader = SessionReader(nc, t, SESSION).replay()
    async with contextlib.aclosing(reader):
        async for _ in reader:
            count += 1
            if count == N_SESSION_READER:
                break
    return count / (time.perf_counter() - started)


async def _run() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer(Path(tmp))
        server.start()
        try:
            nc = await connect(server.url)
            t = _topology()
            await ensure_topology(nc, t)
            published = await _publish(nc, t)
            raw = replay = batches = 0.0
            for _ in range(2):  # alternate, keep the best of each
                raw = max(raw, await _raw(nc, t))
                batches = max(batches, await _batches(nc, t))
                replay = max(replay, await _replay(nc, t))
            reader = await _session_reader(nc, t)
            push = await _stalled_push(nc, t)
            bounded = await _stalled_bounded(nc, t)
            await nc.close()
        finally:
            server.stop()
    FIGURES.update(
        raw_per_s=raw,
        replay_per_s=replay,
        published_per_s=published,
        batches_per_s=batches,
        stalled_push_msgs=push[0],
        stalled_push_bytes=push[1],
        stalled_bounded_msgs=bounded[0],
        stalled_bounded_bytes=bounded[1],
    )
    return _table(published, raw, replay, reader, batches) + _stalled_table(push, bounded)


def _stalled_table(push: tuple[int, int], bounded: tuple[int, int]) -> str:
    lines = [
        "",
        "",
        "One reader that stopped taking after its first batch (held: delivered to the "
        "process, not taken by the caller):",
        "",
        "| read | messages held | bytes held |",
        "| --- | ---: | ---: |",
        f"| ordered push consumer, callback waiting (before issue 30) | {push[0]:,} "
        f"| {push[1]:,} |",
        f"| bounded pull read (`session_batches`' default window) | {bounded[0]:,} "
        f"| {bounded[1]:,} |",
    ]
    return "\n".join(lines)


def _table(published: float, raw: float, replay: float, reader: float, batches: float) -> str:
    rows = [
        ("raw ordered consumer, callback counting (baseline)", raw, 1.0),
        ("`session_batches`: the bounded pull read alone, no decode", batches, batches / raw),
        ("`read_session`: decode + fold + render every chunk (ours)", replay, replay / raw),
        (f"`SessionReader` next_msg loop, first {N_SESSION_READER:,}", reader, reader / raw),
    ]
    lines = [
        f"Session of {N:,} chunks ({N // STEP_CHUNKS:,} steps of {STEP_CHUNKS:,}), one "
        f"nats-server on loopback; published at {published:,.0f} chunks/s first.",
        "",
        "| read path | chunks/s | ratio to raw |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {name} | {rate:,.0f} | {ratio:.2f}x |" for name, rate, ratio in rows]
    verdict = "met" if replay >= raw / 2 else "NOT met"
    lines += ["", f"Target (read_session >= 0.5x raw): {verdict}."]
    return "\n".join(lines)


def main() -> str:
    return asyncio.run(_run())


if __name__ == "__main__":
    print(main())
