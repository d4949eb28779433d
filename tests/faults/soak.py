"""The soak: steady offered load through a real gateway and two assemblers on a three-node
cluster, one random fault per round (a node holding the stream, a follower, the gateway's
node, the KV leader or a consumer leader SIGKILLed and restarted; or an assembler SIGKILLed
and restarted), then the counts and latency percentiles.

    .venv/bin/python -m tests.faults.soak --minutes 5 --seed 7     # make soak
    .venv/bin/pytest tests/faults/test_soak.py                      # one round, in the suite

Counted per chunk: offered (the chunks the gateway published, as the broker holds them),
acknowledged (those of steps the caller saw complete: [DONE] only follows the broker's acks),
persisted (the store's chunk events), lost (acknowledged, not persisted: must be 0),
duplicated (a chunk twice in the broker or the store: must be 0).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.deploy._nats import close, connect_as, provision
from tests.faults import _services as svc
from tests.faults._cluster import TARGETS, Cluster
from tests.faults._load import SCRIPTED, Load, check, percentiles, wait_drained
from tokenwire.broker import Topology, free_port
from tokenwire.replay._source import stored_chunks
from tokenwire.schemas import ChunkEvent, chunk_envelopes
from tokenwire.services.scripted_provider import ScriptedServer
from tokenwire.store import Store, open_store

TOPOLOGY = Topology(partitions=16, replicas=3)
FAULTS = (*TARGETS, "assembler")


@dataclass
class SoakResult:
    rounds: int = 0
    faults: list[str] = field(default_factory=list)
    steps_ok: int = 0
    steps_refused: int = 0
    offered: int = 0
    acknowledged: int = 0
    persisted: int = 0
    lost: int = 0
    duplicated: int = 0
    wrong: int = 0
    verified: int = 0
    sessions: int = 0
    latencies: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        out = {k: v for k, v in asdict(self).items() if k != "latencies"}
        out["latency_s"] = {k: round(v, 2) for k, v in percentiles(sorted(self.latencies)).items()}
        return out


async def _count_chunks(operator, store: Store, load: Load, result: SoakResult) -> None:
    done = {(r.session, r.turn) for r in load.results if r.ok}
    for i in range(load.sessions):
        session = load.session(i)
        broker: Counter[tuple[int, int, int]] = Counter()
        async for batch in stored_chunks(operator, TOPOLOGY, session, idle_timeout_s=20.0):
            for _, payload in batch:
                for env in chunk_envelopes(payload):
                    broker[(env.turn, env.step, env.ordinal)] += 1
        stored: Counter[tuple[int, int, int]] = Counter(
            (e.envelope.turn, e.envelope.step, e.envelope.ordinal)
            for e in await store.session_events(session)
            if isinstance(e, ChunkEvent)
        )
        acked = {k for k in broker if (session, k[0]) in done}
        result.offered += len(broker)
        result.acknowledged += len(acked)
        result.persisted += len(stored)
        result.lost += len(acked - set(stored))
        result.duplicated += sum(n - 1 for n in broker.values()) + sum(
            n - 1 for n in stored.values()
        )


async def soak(workdir: Path, minutes: float, seed: int, sessions: int = 30) -> SoakResult:
    rng = random.Random(seed)
    result = SoakResult()
    cluster = Cluster.start(workdir)
    try:
        await cluster.wait_healthy()
        await asyncio.to_thread(provision, cluster.urls("provisioner"), 3)
        store_url = f"sqlite:///{workdir / 'store.db'}"
        port = free_port()
        gateway = svc.gateway(
            workdir, cluster.urls("gateway"), store_url, f"http://127.0.0.1:{port}", tag="soak"
        )
        assemblers = [
            svc.assembler(
                workdir, cluster.urls("assembler"), store_url, tag=f"s{i}", abandon_s=60.0
            )
            for i in (1, 2)
        ]
        conn = await connect_as("operator", cluster.urls("operator"))
        store = open_store(store_url)
        try:
            with svc.running(gateway, *assemblers):
                for service in (gateway, *assemblers):
                    await service.ready()
                deadline = time.monotonic() + minutes * 60
                async with ScriptedServer(SCRIPTED, port=port):
                    while result.rounds == 0 or time.monotonic() < deadline:
                        await _round(
                            rng,
                            cluster,
                            services=(gateway, assemblers),
                            operator=conn.nc,
                            store=store,
                            result=result,
                            sessions=sessions,
                        )
        finally:
            await store.close()
            await close(conn)
    finally:
        cluster.stop()
    return result


async def _round(rng, cluster, *, services, operator, store, result, sessions):
    gateway, assemblers = services
    fault = rng.choice(FAULTS)
    result.rounds += 1
    result.faults.append(fault)
    await cluster.wait_healthy()
    load = Load(tag=f"soak{result.rounds}", sessions=sessions)
    running = asyncio.create_task(load.run(svc.base_url(gateway)))
    await load.first_turn_done.wait()
    if fault == "assembler":
        victim = rng.choice(assemblers)
        victim.kill()
        await running
        victim.start()
        await victim.ready()
    else:
        node = cluster.node(await cluster.target(operator, TOPOLOGY, fault))
        node.kill()
        await running
        node.start()
        await asyncio.to_thread(node.wait_accepting)
        await cluster.wait_healthy()
    await wait_drained(store, load)
    tally = await check(store, load, operator, TOPOLOGY)
    await _count_chunks(operator, store, load, result)
    result.sessions += sessions
    result.steps_ok += tally.ok
    result.steps_refused += tally.failed
    result.wrong += tally.wrong
    result.verified += tally.verified
    result.latencies += load.latencies()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--sessions", type=int, default=30)
    parser.add_argument("--report", type=Path, help="append the summary as a JSON line here")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tokenwire-soak-") as tmp:
        result = asyncio.run(soak(Path(tmp), args.minutes, args.seed, args.sessions))
    summary = {
        "case": "soak",
        "promise": "lost 0, duplicated 0, refused 0",
        "seed": args.seed,
        "minutes": args.minutes,
        **result.summary(),
    }
    print(json.dumps(summary, indent=2))
    if args.report:
        with args.report.open("a", encoding="utf-8") as out:
            out.write(json.dumps(summary) + "\n")
    return 0 if (result.lost, result.duplicated, result.wrong) == (0, 0, 0) else 1


if __name__ == "__main__":
    sys.exit(main())
