"""``StepRegistry``: unique (session, turn, step) triples across gateway instances, on JetStream KV.

Keys: ``<session>.<turn>.<step>`` marks a claimed triple (created once: KV create fails when
the key exists); ``<session>`` holds the latest assigned ``{"turn": t, "step": s}``, advanced
by compare-and-set (update with the revision read). The claim key decides who owns a triple;
the pointer only says where the next assignment starts. Writes go through :class:`KvWriter`
(sent at once, acked by callback); reads through nats-py's ``KeyValue``.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass

import msgspec
from nats.aio.client import Client
from nats.js.errors import Error as JsError
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from tokenwire.broker._errors import (
    StepAssignmentContention,
    StepClaimConflict,
    StepRegistryError,
    TopologyError,
)
from tokenwire.broker._kvwrite import KvWriter
from tokenwire.broker._topology import Topology


class _Latest(msgspec.Struct, frozen=True, order=True):
    turn: int
    step: int


_latest_decoder = msgspec.json.Decoder(_Latest)
_Known = tuple[int | None, _Latest | None]
"""What is known of a session's pointer: (its KV revision, its value); (None, None) if absent."""


def _following(latest: _Latest | None, new_turn: bool) -> _Latest:
    if latest is None:
        return _Latest(0, 0)
    return _Latest(latest.turn + 1, 0) if new_turn else _Latest(latest.turn, latest.step + 1)


@dataclass(slots=True)
class _Attempt:
    """One assignment attempt on the wire: the pointer's compare-and-set and the claim key's
    create, both sent together."""

    candidate: _Latest
    moved: asyncio.Future[int | None]  # the pointer's new revision, None if it had moved
    claimed: asyncio.Future[int | None]  # the claim key's revision, None if it existed

    async def outcome(self, timeout_s: float) -> tuple[int | None, bool]:
        """(the pointer's new revision or None, whether the claim key was ours)."""
        try:
            async with asyncio.timeout(timeout_s):
                moved = await self.moved
                claimed = await self.claimed
        except TimeoutError:
            self.drop()
            raise StepRegistryError(f"no KV ack within {timeout_s} s") from None
        except BaseException:
            self.drop()
            raise
        return moved, claimed is not None

    def drop(self) -> None:
        """Forget both acks (their failures included)."""
        for future in (self.moved, self.claimed):
            if not future.cancel() and not future.cancelled():
                future.exception()  # done: its failure, if any, is retrieved


class PendingStep:
    """An assignment already sent: :meth:`result` waits for it (and runs any retries); a step
    that ends before it needs its identity calls :meth:`drop` instead."""

    def __init__(
        self, registry: StepRegistry, session: str, new_turn: bool, first: _Attempt | None
    ) -> None:
        self._registry = registry
        self._session = session
        self._new_turn = new_turn
        self._first = first

    async def result(self) -> tuple[int, int]:
        """The claimed (turn, step); StepRegistryError or StepAssignmentContention."""
        first, self._first = self._first, None
        return await self._registry.assign(self._session, self._new_turn, first)

    def drop(self) -> None:
        """Not needed after all: the first attempt's acks are ignored (its triple stays unused)."""
        if self._first is not None:
            self._first.drop()
            self._first = None


class StepRegistry:
    """Claims and assigns steps. ``max_attempts`` bounds the compare-and-set retries,
    ``timeout_s`` each wait for the broker.

    ::

        steps = await StepRegistry.open(nc, topology)
        turn, step = await steps.next_step("s-42", new_turn=False)   # claimed for us
        await steps.claim("s-42", 3, 0)                              # or StepClaimConflict
        pending = await steps.begin_next_step("s-42", new_turn=True) # sent; do other work
        turn, step = await pending.result()

    An assignment moves the session's pointer (compare-and-set) and creates the triple's claim
    key in one round trip, both writes in flight together; the claim key decides ownership.
    The pointer's last revision is remembered per session (at most ``remembered`` sessions,
    least recently used dropped), so a session served by this instance before needs no read:
    one round trip per assignment instead of three, sent before :meth:`begin_next_step`
    returns. A stale memory costs one failed compare-and-set, then the pointer is read.
    """

    def __init__(
        self,
        kv: KeyValue,
        writer: KvWriter,
        max_attempts: int = 64,
        remembered: int = 65536,
        timeout_s: float = 5.0,
    ) -> None:
        self._kv = kv
        self._writer = writer
        self._max_attempts = max_attempts
        self._remembered = remembered
        self._timeout = timeout_s
        self._known: OrderedDict[str, tuple[int, _Latest]] = OrderedDict()

    @classmethod
    async def open(cls, nc: Client, topology: Topology, max_attempts: int = 64) -> StepRegistry:
        """Bind to the bucket ``ensure_topology`` created."""
        try:
            kv = await nc.jetstream().key_value(topology.steps_bucket)
        except JsError as exc:
            raise TopologyError(f"bucket {topology.steps_bucket}", str(exc)) from exc
        writer = await KvWriter(nc, topology.steps_bucket).start()
        return cls(kv, writer, max_attempts)

    async def close(self) -> None:
        """Stop listening for acks (writes still waiting fail)."""
        await self._writer.close()

    async def claim(self, session: str, turn: int, step: int) -> None:
        """Claim the triple for this caller; StepClaimConflict if anyone claimed it before."""
        if await self._settled(await self._create_claim(session, _Latest(turn, step))) is None:
            raise StepClaimConflict(session, turn, step)

    async def next_step(self, session: str, new_turn: bool) -> tuple[int, int]:
        """Assign and claim the session's next (turn, step).

        A new session starts at (0, 0); otherwise ``new_turn`` gives (turn + 1, 0) and a
        continuation (turn, step + 1). Triples claimed explicitly by someone else are skipped.
        """
        return await (await self.begin_next_step(session, new_turn)).result()

    async def begin_next_step(self, session: str, new_turn: bool) -> PendingStep:
        """:meth:`next_step` in two halves: the first attempt is sent (when the session's
        pointer is remembered) before this returns; :meth:`PendingStep.result` finishes it."""
        known = self._known.pop(session, None)
        first = await self._attempt(session, known, new_turn) if known is not None else None
        return PendingStep(self, session, new_turn, first)

    async def assign(self, session: str, new_turn: bool, first: _Attempt | None) -> tuple[int, int]:
        """Run attempts (``first`` already sent, if any) until one triple is ours."""
        attempt, known = first, None
        for _ in range(self._max_attempts):
            if attempt is None:
                known = known if known is not None else await self._read(session)
                attempt = await self._attempt(session, known, new_turn)
            candidate = attempt.candidate
            moved, claimed = await attempt.outcome(self._timeout)
            attempt = None
            if claimed and moved is None:  # another assignment moved the pointer meanwhile
                moved = await self._adopt(session, candidate)
                if moved is None:
                    known = None  # the claim is stale (an older turn): left unused
                    continue
            if claimed and moved is not None:
                self._remember(session, moved, candidate)
                return candidate.turn, candidate.step
            if moved is None:
                known = None  # lost the compare-and-set: read again
            else:
                known = (moved, candidate)  # an explicit claim took it: move past it, same turn
                new_turn = False
        raise StepAssignmentContention(session, self._max_attempts)

    async def _attempt(self, session: str, known: _Known, new_turn: bool) -> _Attempt:
        revision, latest = known
        candidate = _following(latest, new_turn)
        moved = await self._move(session, candidate, revision)
        try:
            claimed = await self._create_claim(session, candidate)
        except BaseException:
            moved.cancel()
            raise
        return _Attempt(candidate, moved, claimed)

    def _remember(self, session: str, revision: int, latest: _Latest) -> None:
        self._known[session] = (revision, latest)
        if len(self._known) > self._remembered:
            self._known.popitem(last=False)

    async def _read(self, session: str) -> _Known:
        try:
            entry = await self._kv.get(session)
        except KeyNotFoundError:
            return None, None
        except JsError as exc:
            raise StepRegistryError(f"read {session}: {exc}") from exc
        return entry.revision, _latest_decoder.decode(entry.value or b"")

    async def _adopt(self, session: str, candidate: _Latest) -> int | None:
        """We own ``candidate`` but another assignment moved the pointer from the same base.

        Concurrent assignments keep both triples: the pointer is raised to ``candidate`` if
        it is below, and kept if it is past it in the same turn. A pointer in a later turn
        means our base was stale (we remembered an old revision): the candidate would be a
        step of a finished turn, so it stays claimed but unused (None) and the caller assigns
        again from the pointer. Returns the pointer's revision when the candidate is ours.
        """
        for _ in range(self._max_attempts):
            revision, latest = await self._read(session)
            if latest is not None and revision is not None and latest >= candidate:
                return revision if latest.turn == candidate.turn else None
            moved = await self._settled(await self._move(session, candidate, revision))
            if moved is not None:
                return moved
        raise StepAssignmentContention(session, self._max_attempts)

    async def _create_claim(self, session: str, triple: _Latest) -> asyncio.Future[int | None]:
        """Send the triple's claim key create (resolves to None if the key existed)."""
        return await self._writer.put_if(f"{session}.{triple.turn}.{triple.step}", b"1", last=0)

    async def _move(
        self, session: str, value: _Latest, revision: int | None
    ) -> asyncio.Future[int | None]:
        """Send the pointer's compare-and-set from ``revision`` (absent: None); resolves to
        its new revision, or None when someone moved it first."""
        return await self._writer.put_if(session, msgspec.json.encode(value), last=revision or 0)

    async def _settled(self, write: asyncio.Future[int | None]) -> int | None:
        try:
            async with asyncio.timeout(self._timeout):
                return await write
        except TimeoutError:
            raise StepRegistryError(f"no KV ack within {self._timeout} s") from None
