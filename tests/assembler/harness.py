"""Helpers for the service tests: publish scripted sessions, check the store against them."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from nats.aio.client import Client

from tests.assembler.scripts import Script, envelopes, random_script
from tests.fixtures.frames import framed
from tokenwire.broker import ChunkPublisher, Topology
from tokenwire.schemas import ChunkEnvelope, ChunkEvent, ErrorEvent, MessageEvent, json_encoder
from tokenwire.services.assembler import AssemblerSettings
from tokenwire.store import Store


@dataclass
class Plan:
    """Sessions of scripted steps: the ground truth the store must end up holding."""

    steps: dict[str, list[tuple[int, int, Script, list[ChunkEnvelope]]]] = field(
        default_factory=dict
    )

    def add(self, session: str, turn: int, step: int, script: Script) -> list[ChunkEnvelope]:
        envs = envelopes(session, turn, step, script)
        self.steps.setdefault(session, []).append((turn, step, script, envs))
        return envs

    @property
    def chunk_count(self) -> int:
        return sum(len(e) for steps in self.steps.values() for *_, e in steps)


def make_plan(seed: int, sessions: int, turns: int, prefix: str = "s") -> Plan:
    print(f"plan seed {seed}")
    rng = random.Random(seed)
    plan = Plan()
    for i in range(sessions):
        for turn in range(turns):
            plan.add(f"{prefix}{i}", turn, 0, random_script(rng))
    return plan


async def publish_plan(
    nc: Client, topology: Topology, plan: Plan, seed: int = 0, frame_size: int = 0
) -> None:
    """Publish every session's steps in order, sessions interleaved at random; with a
    ``frame_size``, in frames of that many chunks (each step's first chunk alone)."""
    rng = random.Random(seed)
    queues = {s: [e for *_, envs in steps for e in envs] for s, steps in plan.steps.items()}
    messages = {
        s: list(framed(envs, frame_size))
        if frame_size
        else [(e, json_encoder.encode(e)) for e in envs]
        for s, envs in queues.items()
    }
    publisher = await ChunkPublisher(nc, topology).start()
    try:
        while messages:
            session = rng.choice(sorted(messages))
            env, payload = messages[session].pop(0)
            await publisher.publish(
                payload, env.session, env.turn, env.step, env.ordinal, first=env.ordinal == 0
            )
            if not messages[session]:
                del messages[session]
        await publisher.flush(10)
    finally:
        await publisher.close()


async def publish_one(publisher: ChunkPublisher, env: ChunkEnvelope) -> None:
    await publisher.publish(
        json_encoder.encode(env),
        env.session,
        env.turn,
        env.step,
        env.ordinal,
        first=env.ordinal == 0,
    )


async def check_store(store: Store, plan: Plan) -> None:
    """Every session holds exactly its steps, in order, with contiguous seqs from 1."""
    for session, steps in plan.steps.items():
        outcomes = await store.messages(session)
        got = [(o.turn, o.step, o.seq_start, o.seq_end) for o in outcomes]
        assert [(o.turn, o.step) for o in outcomes] == [(t, s) for t, s, *_ in steps], (
            session,
            got,
        )
        seq = 1
        for outcome, (_, _, script, envs) in zip(outcomes, steps, strict=True):
            recorded = outcome.message if isinstance(outcome, MessageEvent) else outcome.error
            assert isinstance(outcome, MessageEvent | ErrorEvent)
            assert recorded == script.expected, (session, outcome.turn)
            assert (outcome.seq_start, outcome.seq_end) == (seq, seq + len(envs) - 1)
            seq += len(envs)
        events = await store.session_events(session)
        chunks = [e for e in events if isinstance(e, ChunkEvent)]
        assert [c.seq for c in chunks] == list(range(1, seq))
        assert [c.envelope for c in chunks] == [e for *_, envs in steps for e in envs]


def settings_for(
    nats_url: str, topology: Topology, store_url: str, **kw: object
) -> AssemblerSettings:
    base: dict[str, object] = {
        "nats_urls": (nats_url,),
        "store_url": store_url,
        "topology": topology,
        "provision": False,
        "metrics_addr": None,
        "batch_max_s": 0.005,
        "burst": True,
        "lag_poll_s": 0.2,
        "expire_interval_s": 0.1,
        "backoff_initial_s": 0.02,
        "backoff_max_s": 0.2,
        "tune_gc": False,  # process-wide; the test process is shared with other tests
    }
    base.update(kw)
    return AssemblerSettings(**base)  # type: ignore[arg-type]  # overrides given by keyword, checked by the dataclass at run time


async def eventually(predicate, timeout_s: float = 20.0, what: str = "condition") -> None:
    """Poll an async predicate until it holds (bounded)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
