"""Every acknowledgement follows the commit it acknowledges, also while an expiry pass still
asks the broker, and a redelivery is kept, not handed back, while the store cannot answer
whether its step is stored: an Assembler over a recording connection (no server: the acks
and naks are what is checked), a MemoryStore and an expiry whose claim reads a test holds."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from tests.assembler.harness import settings_for
from tests.assembler.scripts import envelopes, text_step
from tokenwire.broker import ConsumedMessage, StepRecord, Topology
from tokenwire.schemas import ChunkEnvelope, ErrorEvent, MessageEvent, json_encoder
from tokenwire.services.assembler import Assembler, AssemblyConfig
from tokenwire.services.assembler._expiry import Expiry, PartitionView
from tokenwire.store import (
    CommittedStep,
    MemoryStore,
    StoreConfigError,
    StoreIntegrityError,
)
from tokenwire.store import StepRecord as Record

S = 1_000_000_000
ACK = b"+ACK"


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000 * S

    def __call__(self) -> int:
        return self.now


class DeadLetters:
    """The DLQ stream's side of a JetStream publish: refused (no answer) until ``up``."""

    def __init__(self) -> None:
        self.up = False
        self.copied: list[bytes] = []

    async def publish(self, subject: str, payload: bytes, **_: Any) -> None:
        if not self.up:
            raise TimeoutError  # the broker restarting
        self.copied.append(payload)


class Connection:
    """Records what is published (the acks); answers a request with a stored PubAck."""

    is_connected = True
    is_closed = False

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.dlq = DeadLetters()

    def jetstream(self) -> DeadLetters:
        return self.dlq

    async def publish(self, subject: str, payload: bytes = b"", **_: Any) -> None:
        self.sent.append((subject, payload))

    async def request(self, subject: str, payload: bytes, *_: Any, **__: Any) -> Any:
        return SimpleNamespace(data=b'{"stream": "EVENTS", "seq": 1}', headers=None)

    def acked(self) -> list[int]:
        """Stream seqs acknowledged, in order (the reply subjects' seq field)."""
        return [int(subject.split(".")[5]) for subject, payload in self.sent if payload == ACK]

    def terminated(self) -> list[int]:
        """Stream seqs terminated (``+TERM``), in order."""
        return [
            int(subject.split(".")[5])
            for subject, payload in self.sent
            if payload.startswith(b"+TERM")
        ]

    def naked(self) -> list[int]:
        """Stream seqs handed back (``-NAK``, with or without a delay), in order."""
        return [
            int(subject.split(".")[5])
            for subject, payload in self.sent
            if payload.startswith(b"-NAK")
        ]


class HeldClaims:
    """Answers "no claim" at once, except for ``held``'s: that read waits for ``answer``."""

    def __init__(self, held: str) -> None:
        self.held = held
        self.asked = asyncio.Event()
        self.answer = asyncio.Event()

    async def record(self, session: str, turn: int, step: int) -> StepRecord | None:
        if session == self.held:
            self.asked.set()
            await self.answer.wait()
        return None


def delivered(nc: Connection, env: ChunkEnvelope, seq: int, times: int = 1) -> ConsumedMessage:
    reply = f"$JS.ACK.TOKENWIRE.assembler-p0.{times}.{seq}.{seq}.0.0"
    subject = f"tokenwire.chunks.0.{env.session}.next"
    return ConsumedMessage(subject, reply, json_encoder.encode(env), None, None, nc)  # type: ignore[arg-type]  # the recording connection


async def test_a_redelivery_during_an_expiry_pass_is_acknowledged_after_the_commit() -> None:
    """Two quiet steps due; the pass closes ``x`` and then asks for ``y``'s claim; meanwhile
    the server redelivers a message ``x`` holds (held past ``ack_wait``). It must not be
    acknowledged before ``x`` is stored (it was: the pass had closed ``x`` in the Assembly
    but handed it to the Committer only at its end, so the redelivery was settled at once)."""
    nc, clock, store = Connection(), Clock(), MemoryStore()
    quick = AssemblyConfig(abandon_timeout_s=10.0, gap_timeout_s=10.0)
    settings = settings_for("nats://unused", Topology(), "memory://", assembly=quick)
    assembler = Assembler(settings, nc, store, clock=clock)  # type: ignore[arg-type]  # the recording connection
    claims = HeldClaims("y")

    async def held_and_caught_up(partition: int) -> PartitionView:
        return PartitionView(owner=True, caught_up=True)

    assembler.expiry = Expiry(assembler.assembly, held_and_caught_up, claims, lambda s: 0)
    x = envelopes("x", 0, 0, text_step(["a", "b"]), t0=clock.now)[:2]  # no finish: quiet
    y = envelopes("y", 0, 0, text_step(["c"]), t0=clock.now)[:1]
    await assembler.handle_batch([delivered(nc, x[0], 1), delivered(nc, x[1], 2)], 0)
    await assembler.handle_batch([delivered(nc, y[0], 3)], 0)
    clock.now += 11 * S  # both due; no claim: the pass closes both
    expiring = asyncio.create_task(assembler.expire())
    await asyncio.wait_for(claims.asked.wait(), 5.0)  # x decided, y's claim being read
    await assembler.handle_batch([delivered(nc, x[0], 1, times=2)], 0)
    assert await store.step_outcome("x", 0, 0) is None
    assert nc.acked() == []  # nothing of x is acknowledged before its commit
    claims.answer.set()
    await asyncio.wait_for(expiring, 5.0)
    await assembler.committer.commit_batch()
    outcome = await store.step_outcome("x", 0, 0)
    assert isinstance(outcome, ErrorEvent)
    assert outcome.error.kind == "abandoned"
    assert sorted(nc.acked()) == [1, 2, 3]


class UnusableStore(MemoryStore):
    """Lookups fail as unusable (``StoreConfigError``, as SQLite's "file is not a database")
    until ``fixed``."""

    def __init__(self) -> None:
        super().__init__()
        self.fixed = asyncio.Event()
        self.refused = asyncio.Event()

    async def step_outcome(
        self, session: str, turn: int, step: int
    ) -> MessageEvent | ErrorEvent | None:
        if not self.fixed.is_set():
            self.refused.set()
            raise StoreConfigError("sqlite:///store.db", "file is not a database")
        return await super().step_outcome(session, turn, step)


async def test_a_redelivery_waits_for_a_store_that_cannot_say_whether_its_step_is_stored() -> None:
    """The lookup of a redelivered chunk's step failed as unusable (not unavailable): the
    message was naked after 0.1 s, again and again, each time one of its ``max_deliver``
    deliveries; once they are spent the server never delivers it again, and its step can
    neither be stored nor closed. It waits for the store, as a commit does."""
    nc, store = Connection(), UnusableStore()
    settings = settings_for("nats://unused", Topology(), "memory://")
    assembler = Assembler(settings, nc, store)  # type: ignore[arg-type]  # the recording connection
    env = envelopes("x", 0, 0, text_step(["a"]))[0]
    handling = asyncio.create_task(assembler.handle_batch([delivered(nc, env, 1, times=2)], 0))
    refused = asyncio.ensure_future(store.refused.wait())
    await asyncio.wait({refused, handling}, timeout=5.0, return_when="FIRST_COMPLETED")
    refused.cancel()
    assert store.refused.is_set()
    assert not handling.done()  # waiting for the store
    assert nc.naked() == []
    assert not assembler.committer.store_ok  # not ready meanwhile
    store.fixed.set()
    await asyncio.wait_for(handling, 5.0)
    assert nc.naked() == []
    assert assembler.assembly.is_open(("x", 0, 0))  # not stored: the chunk opened its step


class RejectingStore(MemoryStore):
    """Rejects every step of session ``bad`` (as PostgreSQL rejects a NUL in text)."""

    async def commit(self, records: Sequence[Record]) -> list[CommittedStep]:
        if any(r.session == "bad" for r in records):
            raise StoreIntegrityError("unsupported Unicode escape sequence", "bad", 0, 0)
        return await super().commit(records)


async def test_a_rejected_step_not_dead_lettered_is_dead_lettered_on_its_redelivery() -> None:
    """The store rejects a step and the broker does not take its dead-letter copies (it is
    restarting): its messages stay unsettled, to be dead-lettered when redelivered. The
    redeliveries found the step closed here and were acknowledged as duplicates: the step
    neither stored nor dead-lettered, gone without a trace."""
    nc, store = Connection(), RejectingStore()
    settings = settings_for("nats://unused", Topology(), "memory://")
    assembler = Assembler(settings, nc, store)  # type: ignore[arg-type]  # the recording connection
    bad = envelopes("bad", 0, 0, text_step(["a"]))
    await assembler.handle_batch([delivered(nc, e, i + 1) for i, e in enumerate(bad)], 0)
    await assembler.committer.commit_batch()  # rejected; its dead-lettering failed
    assert nc.dlq.copied == []
    assert (nc.acked(), nc.terminated()) == ([], [])
    nc.dlq.up = True  # after ack_wait the server delivers them again
    await assembler.handle_batch([delivered(nc, e, i + 1, 2) for i, e in enumerate(bad)], 0)
    assert nc.acked() == []  # not settled as duplicates of a step that was never stored
    await assembler.committer.commit_batch()
    assert nc.acked() == []
    assert nc.terminated() == [1, 2, 3]
    assert len(nc.dlq.copied) == 3
    assert await store.step_outcome("bad", 0, 0) is None
