"""``StepRegistry``: unique (session, turn, step) triples across gateway instances, on JetStream KV.

Keys: ``<session>.<turn>.<step>`` marks a claimed triple (created once: KV create fails when
the key exists); ``<session>`` holds the latest assigned ``{"turn": t, "step": s}``, advanced
by compare-and-set (update with the revision read). The claim key decides who owns a triple;
the pointer only says where the next assignment starts.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import msgspec
from nats.aio.client import Client
from nats.js.errors import Error as JsError
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from tokenwire.broker._errors import (
    StepAssignmentContention,
    StepClaimConflict,
    StepRegistryError,
    TopologyError,
)
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


class StepRegistry:
    """Claims and assigns steps. ``max_attempts`` bounds the compare-and-set retries.

    ::

        steps = await StepRegistry.open(nc, topology)
        turn, step = await steps.next_step("s-42", new_turn=False)   # claimed for us
        await steps.claim("s-42", 3, 0)                              # or StepClaimConflict

    An assignment moves the session's pointer (compare-and-set) and creates the triple's claim
    key in one round trip, both requests in flight together; the claim key decides ownership.
    The pointer's last revision is remembered per session (at most ``remembered`` sessions,
    least recently used dropped), so a session served by this instance before needs no read:
    one round trip per assignment instead of three. A stale memory costs one failed
    compare-and-set, then the pointer is read.
    """

    def __init__(self, kv: KeyValue, max_attempts: int = 64, remembered: int = 65536) -> None:
        self._kv = kv
        self._max_attempts = max_attempts
        self._remembered = remembered
        self._known: OrderedDict[str, tuple[int, _Latest]] = OrderedDict()

    @classmethod
    async def open(cls, nc: Client, topology: Topology, max_attempts: int = 64) -> StepRegistry:
        """Bind to the bucket ``ensure_topology`` created."""
        try:
            kv = await nc.jetstream().key_value(topology.steps_bucket)
        except JsError as exc:
            raise TopologyError(f"bucket {topology.steps_bucket}", str(exc)) from exc
        return cls(kv, max_attempts)

    async def claim(self, session: str, turn: int, step: int) -> None:
        """Claim the triple for this caller; StepClaimConflict if anyone claimed it before."""
        if not await self._try_claim(session, _Latest(turn, step)):
            raise StepClaimConflict(session, turn, step)

    async def next_step(self, session: str, new_turn: bool) -> tuple[int, int]:
        """Assign and claim the session's next (turn, step).

        A new session starts at (0, 0); otherwise ``new_turn`` gives (turn + 1, 0) and a
        continuation (turn, step + 1). Triples claimed explicitly by someone else are skipped.
        """
        known: _Known | None = self._known.pop(session, None)
        for _ in range(self._max_attempts):
            if known is None:
                known = await self._read(session)
            revision, latest = known
            candidate = _following(latest, new_turn)
            moved, claimed = await asyncio.gather(
                self._cas(session, candidate, revision), self._try_claim(session, candidate)
            )
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
            moved = await self._cas(session, candidate, revision)
            if moved is not None:
                return moved
        raise StepAssignmentContention(session, self._max_attempts)

    async def _try_claim(self, session: str, triple: _Latest) -> bool:
        """Create the triple's claim key: True if created, False if it existed."""
        try:
            await self._kv.create(f"{session}.{triple.turn}.{triple.step}", b"1")
        except KeyWrongLastSequenceError:
            return False
        except JsError as exc:
            raise StepRegistryError(f"claim {session}/{triple.turn}/{triple.step}: {exc}") from exc
        return True

    async def _cas(self, session: str, value: _Latest, revision: int | None) -> int | None:
        """Set the pointer if it is still at ``revision`` (absent: None); its new revision, or
        None when someone moved it first."""
        data = msgspec.json.encode(value)
        try:
            if revision is None:
                return await self._kv.create(session, data)
            return await self._kv.update(session, data, last=revision)
        except KeyWrongLastSequenceError:
            return None
        except JsError as exc:
            raise StepRegistryError(f"advance {session}: {exc}") from exc
