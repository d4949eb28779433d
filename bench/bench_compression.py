"""Bytes per retained chunk on disk, with and without the chunk streams' S2 compression.

The load is realistic, not synthetic: every recorded provider stream in the shared fixtures
(``../shared/fixtures/provider-recordings``, OpenAI, Anthropic, DeepSeek, Gemini, ... text,
reasoning, tool calls, usage, errors) normalised by tokenwire's own adapters, each chunk in
the envelope the gateway publishes (session ids as the gateway makes them, times, provider,
model), published with ``ChunkPublisher`` (``Nats-Msg-Id`` headers) to a provisioned
topology, once with ``compression: s2`` and once with ``none``, on one embedded nats-server.

Two figures per setting:

- ``disk``: the size of the stream's directory in the server's store (``du`` of its files,
  the message blocks and indexes), after the server was stopped (SIGTERM: every block
  written and, with S2, compressed); what the volume holds;
- ``accounted``: the server's own ``state.bytes``, what ``max_bytes`` limits.

Run: ``python -m bench.bench_compression [--chunks N] [--order s2,none]`` prints one JSON
object; ``make bench BENCH=compression`` records the figures (phase ``compression``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
import uuid
from pathlib import Path

from tokenwire.broker import ChunkPublisher, EmbeddedServer, Topology, connect, ensure_topology
from tokenwire.providers import normalise_body
from tokenwire.schemas import ChunkEnvelope, StreamChunk, json_encoder

RECORDINGS = Path(
    os.environ.get(
        "TOKENWIRE_RECORDINGS",
        Path(__file__).resolve().parents[2] / "shared" / "fixtures" / "provider-recordings",
    )
)  # the tests' default and override (tests/fixtures/recordings.py)
PROVIDERS = {
    "openai": "openai",
    "azure-openai": "azure",
    "openai-responses": "openai-responses",
    "anthropic": "anthropic",
    "deepseek": "deepseek",
    "google": "gemini",
    "groq": "groq",
    "openrouter": "openrouter",
    "vllm": "vllm",
}


def recorded_steps() -> list[tuple[str, list[StreamChunk]]]:
    """(provider, chunks) of every recording the adapters accept."""
    steps = []
    for folder, provider in PROVIDERS.items():
        for path in sorted((RECORDINGS / folder).glob("*.sse")):
            try:
                chunks = normalise_body(provider, path.read_bytes())
            except Exception:  # a recording of a failure the adapter refuses
                continue
            if chunks:
                steps.append((provider, chunks))
    if not steps:
        raise FileNotFoundError(f"no provider recordings under {RECORDINGS} (TOKENWIRE_RECORDINGS)")
    return steps


def envelopes(total: int) -> list[tuple[str, int, int, bytes]]:
    """``total`` chunk envelopes: the recorded steps cycled, each step its own session."""
    steps = recorded_steps()
    out: list[tuple[str, int, int, bytes]] = []
    now = time.time_ns()
    i = 0
    while len(out) < total:
        provider, chunks = steps[i % len(steps)]
        session = str(uuid.uuid4())
        for ordinal, chunk in enumerate(chunks):
            env = ChunkEnvelope(
                session,
                0,
                0,
                ordinal,
                now + ordinal * 20_000_000,
                provider,
                f"{provider}-model",
                chunk,
                request_time_ns=now if ordinal == 0 else None,
            )
            out.append((session, 0, ordinal, json_encoder.encode(env)))
        i += 1
    return out[:total]


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def publish(
    server: EmbeddedServer, t: Topology, load: list[tuple[str, int, int, bytes]]
) -> tuple[int, float, float]:
    """Publish the load; (the server's ``state.bytes``, acked chunks per second, the server's
    CPU microseconds per chunk from the first publish to 1 s after the last ack)."""
    nc = await connect(server.url)
    pid = server.pid
    try:
        await ensure_topology(nc, t)
        publisher = await ChunkPublisher(nc, t).start()
        cpu0, started = cpu_s(pid), time.perf_counter()
        for session, step, ordinal, payload in load:
            await publisher.publish(payload, session, 0, step, ordinal, first=ordinal == 0)
        await publisher.flush(120.0)
        rate = len(load) / (time.perf_counter() - started)
        await asyncio.sleep(1.0)  # blocks sealed at the end are compressed now, not at stop
        cpu_us = (cpu_s(pid) - cpu0) * 1e6 / len(load)
        await publisher.close()
        info = await nc.jetstream().stream_info(t.stream)
        return int(info.state.bytes), rate, cpu_us
    finally:
        await nc.close()


def disk_bytes(store: Path, stream: str) -> int:
    """Bytes of the stream's files in the server's store (every account's directory)."""
    return sum(
        f.stat().st_size
        for d in store.glob(f"jetstream/*/streams/{stream}")
        for f in d.rglob("*")
        if f.is_file()
    )


async def measure(chunks: int, order: tuple[str, ...] = ("none", "s2")) -> dict[str, object]:
    load = envelopes(chunks)
    payload = sum(len(p) for *_, p in load)
    figures: dict[str, object] = {
        "chunks": len(load),
        "payload_bytes_per_chunk": payload / len(load),
    }
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedServer(Path(tmp))
        server.start()
        store = Path(tmp) / "jetstream"
        accounted, rates, cpu = {}, {}, {}
        try:
            for compression in order:
                t = Topology(
                    prefix=f"c{compression}",
                    stream=f"C_{compression.upper()}",
                    events_stream=f"CE_{compression}",
                    dlq_stream=f"CD_{compression}",
                    steps_bucket=f"cs-{compression}",
                    compression=compression,
                    max_bytes=1024**3,
                )
                got = await publish(server, t, load)
                accounted[compression], rates[compression], cpu[compression] = got
        finally:
            server.stop()  # every block written out (and compressed) before it is measured
        disk = {}
        for compression in ("none", "s2"):
            stream = f"C_{compression.upper()}"
            disk[compression] = disk_bytes(store.parent, stream) or disk_bytes(store, stream)
            figures[compression] = {
                "disk_bytes_per_chunk": round(disk[compression] / len(load), 1),
                "accounted_bytes_per_chunk": round(accounted[compression] / len(load), 1),
                "published_chunks_per_s": round(rates[compression]),
                "server_cpu_us_per_chunk": round(cpu[compression], 2),
            }
    figures["disk_ratio_none_to_s2"] = round(disk["none"] / disk["s2"], 2)
    return figures


CHUNKS = 200_000
FIGURES: dict[str, float] = {}
"""What ``python -m bench compression`` records (phase ``compression``)."""


def main() -> str:
    """The suite's entry (``python -m bench compression``): the table; FIGURES filled."""
    figures = asyncio.run(measure(CHUNKS))
    none, s2 = figures["none"], figures["s2"]
    assert isinstance(none, dict)
    assert isinstance(s2, dict)
    for name, row in (("none", none), ("s2", s2)):
        for key, value in row.items():
            FIGURES[f"{name}_{key}"] = float(value)
    ratio = figures["disk_ratio_none_to_s2"]
    assert isinstance(ratio, float)
    FIGURES["disk_ratio_none_to_s2"] = ratio
    lines = [
        f"{figures['chunks']:,} recorded-stream chunks (envelope payload "
        f"{figures['payload_bytes_per_chunk']:.1f} B), one embedded nats-server",
        "",
        "| compression | on disk (B/chunk) | state.bytes (B/chunk) | acked publishes/s "
        "| nats-server CPU (us/chunk) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, row in (("none", none), ("s2", s2)):
        disk, held = row["disk_bytes_per_chunk"], row["accounted_bytes_per_chunk"]
        lines.append(
            f"| {name} | {disk} | {held} | {row['published_chunks_per_s']:,} "
            f"| {row['server_cpu_us_per_chunk']} |"
        )
    lines.append(f"\ndisk none / s2: {figures['disk_ratio_none_to_s2']}x")
    return "\n".join(lines)


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=CHUNKS)
    parser.add_argument("--order", default="none,s2", help="which setting publishes first")
    args = parser.parse_args()
    order = tuple(args.order.split(","))
    print(json.dumps(asyncio.run(measure(args.chunks, order)), indent=2))


if __name__ == "__main__":
    cli()
