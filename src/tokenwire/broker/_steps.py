"""``StepRegistry``: unique (session, turn, step) triples across gateway instances, on JetStream KV.

Keys: ``<session>.<turn>.<step>`` marks a claimed triple (created once: KV create fails when
the key exists); ``<session>`` holds the latest assigned ``{"turn": t, "step": s}``, advanced
by compare-and-set (update with the revision read).
"""

from __future__ import annotations

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


class _Latest(msgspec.Struct, frozen=True):
    turn: int
    step: int


_latest_decoder = msgspec.json.Decoder(_Latest)


class StepRegistry:
    """Claims and assigns steps. ``max_attempts`` bounds the compare-and-set retries.

    ::

        steps = await StepRegistry.open(nc, topology)
        turn, step = await steps.next_step("s-42", new_turn=False)   # claimed for us
        await steps.claim("s-42", 3, 0)                              # or StepClaimConflict
    """

    def __init__(self, kv: KeyValue, max_attempts: int = 64) -> None:
        self._kv = kv
        self._max_attempts = max_attempts

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
        try:
            await self._kv.create(f"{session}.{turn}.{step}", b"1")
        except KeyWrongLastSequenceError as exc:
            raise StepClaimConflict(session, turn, step) from exc
        except JsError as exc:
            raise StepRegistryError(f"claim {session}/{turn}/{step}: {exc}") from exc

    async def next_step(self, session: str, new_turn: bool) -> tuple[int, int]:
        """Assign and claim the session's next (turn, step).

        A new session starts at (0, 0); otherwise ``new_turn`` gives (turn + 1, 0) and a
        continuation (turn, step + 1). Triples claimed explicitly by someone else are skipped.
        """
        for _ in range(self._max_attempts):
            candidate = await self._advance(session, new_turn)
            if candidate is None:
                continue  # lost the compare-and-set: read again
            try:
                await self.claim(session, *candidate)
            except StepClaimConflict:
                new_turn = False  # an explicit claim took it; move past it in the same turn
                continue
            return candidate
        raise StepAssignmentContention(session, self._max_attempts)

    async def _advance(self, session: str, new_turn: bool) -> tuple[int, int] | None:
        try:
            entry = await self._kv.get(session)
        except KeyNotFoundError:
            return await self._cas(session, _Latest(0, 0), None)
        except JsError as exc:
            raise StepRegistryError(f"read {session}: {exc}") from exc
        latest = _latest_decoder.decode(entry.value or b"")
        following = (
            _Latest(latest.turn + 1, 0) if new_turn else _Latest(latest.turn, latest.step + 1)
        )
        return await self._cas(session, following, entry.revision)

    async def _cas(
        self, session: str, value: _Latest, revision: int | None
    ) -> tuple[int, int] | None:
        data = msgspec.json.encode(value)
        try:
            if revision is None:
                await self._kv.create(session, data)
            else:
                await self._kv.update(session, data, last=revision)
        except KeyWrongLastSequenceError:
            return None
        except JsError as exc:
            raise StepRegistryError(f"advance {session}: {exc}") from exc
        return value.turn, value.step
