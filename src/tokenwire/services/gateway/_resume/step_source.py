"""A claimed step's chunks read back from the broker, for a caller that resumes it.

:class:`StepSource` is the seam (``GatewayDeps.history``): ``chunks(...)`` yields the step's
envelopes in ordinal order, from ordinal 0, in lists as they come, and ends after its
``finish``; a step still running is followed live. The real one reads the broker through its
public readers only; the in-memory twin reads a :class:`~tokenwire.broker.MemoryPublisher`.
The step's first chunk is found without reading the session from its start: one read of the
session's ``.first`` subject from the claim's time (again :data:`CLOCK_MARGIN_S` earlier when
the servers' clocks differ, at most :data:`MAX_FIRSTS` messages). Nothing for ``idle_s`` ends
the read with :class:`StepAbandonedError`; a step that must have ended and is not found,
:class:`StepGoneError`, unless the store keeps it: a step gone from the broker's retention is
read from the store's chunk log (:class:`FromStore`). docs/gateway.md, "Resuming a step";
ADR 0029.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from typing import Protocol

from tokenwire.broker import (
    BrokerError,
    Connection,
    MemoryPublisher,
    Topology,
    next_stored,
    session_batches,
    stored_subject,
    stream_info,
)
from tokenwire.schemas import ChunkEnvelope, ChunkEvent, Finish, chunk_envelopes
from tokenwire.services.gateway._errors import (
    BrokerUnavailableError,
    StepAbandonedError,
    StepGoneError,
)
from tokenwire.store import Store, StoreError

CLOCK_MARGIN_S = 10.0
"""How far before the claim's time the search for the step's first chunk starts: the claim's
time is the KV stream's clock, the chunk's the chunk stream's (another node in a cluster)."""
MAX_FIRSTS = 4096
"""Steps of the session read past, at most, before the step's own first chunk is given up."""

Triple = tuple[str, int, int]


class StepSource(Protocol):
    """Reads one claimed step back (see the module)."""

    def chunks(
        self, triple: Triple, since_ns: int, *, idle_s: float, ended: bool
    ) -> AsyncGenerator[list[ChunkEnvelope], None]:
        """The step's envelopes from ordinal 0 in order, ending after its finish.
        ``since_ns``: the claim's broker time (0: unknown); ``ended``: the step must have
        ended by now (a step not found is then gone, not awaited)."""
        ...


class _InOrder:
    """Envelopes of one step put back in ordinal order (a resent chunk may be stored after
    its successor); duplicates dropped. Holds at most what is out of order."""

    def __init__(self) -> None:
        self.next = 0
        self.finished = False
        self._early: dict[int, ChunkEnvelope] = {}

    def add(self, envelopes: list[ChunkEnvelope]) -> list[ChunkEnvelope]:
        out: list[ChunkEnvelope] = []
        for envelope in envelopes:
            if envelope.ordinal >= self.next and not self.finished:
                self._early[envelope.ordinal] = envelope
            while not self.finished and (ready := self._early.pop(self.next, None)) is not None:
                out.append(ready)
                self.next += 1
                self.finished = isinstance(ready.chunk, Finish)
        return out


class FromStore(list[ChunkEnvelope]):
    """A step's envelopes read from the store's chunk log (the broker no longer retains it):
    the answer says so (``x-tokenwire-source: store``)."""


class BrokerStepSource:
    """The real :class:`StepSource` on a connection (see the module); ``store``: where a step
    gone from the broker is read from (None: nowhere)."""

    def __init__(
        self, nc: Connection, topology: Topology, store: Callable[[], Store] | None = None
    ) -> None:
        self._nc = nc
        self._topology = topology
        self._store = store

    async def chunks(
        self, triple: Triple, since_ns: int, *, idle_s: float, ended: bool
    ) -> AsyncGenerator[list[ChunkEnvelope], None]:
        try:
            start = await self._start(triple, since_ns)
        except BrokerError as exc:
            raise BrokerUnavailableError("the broker did not answer", detail=str(exc)) from exc
        found, from_seq = start
        if not found and (stored := await self._stored(triple)):
            yield stored
            return
        if not found and ended:
            raise _gone(triple)
        order = _InOrder()
        batches = session_batches(self._nc, self._topology, triple[0], from_seq, follow=True)
        try:
            async for ready in _followed(batches, triple, order, idle_s):
                yield ready
        finally:
            await batches.aclose()

    async def _stored(self, triple: Triple) -> FromStore | None:
        """The step from the store's chunk log, when the store holds it whole."""
        if self._store is None:
            return None
        try:
            store = self._store()
            outcome = await store.step_outcome(*triple)
            if outcome is None or outcome.seq_end < outcome.seq_start:
                return None
            events = await store.session_events(triple[0], outcome.seq_start, outcome.seq_end)
        except StoreError as exc:
            raise BrokerUnavailableError("the store did not answer", detail=str(exc)) from exc
        return FromStore(e.envelope for e in events if isinstance(e, ChunkEvent)) or None

    async def _start(self, triple: Triple, since_ns: int) -> tuple[bool, int]:
        """(found, the seq to read from): the step's first chunk, or the stream's end."""
        session, turn, step = triple
        stream = self._topology.stream_of(session)
        info = await stream_info(self._nc, stream)
        end = int((info.get("state") or {}).get("last_seq") or 0) + 1
        subject = stored_subject(self._topology, session, first=True)
        if since_ns:  # the usual case: the step's first chunk is the first one since the claim
            stored = await next_stored(
                self._nc, self._topology.stream_of(session), subject, since_ns=since_ns
            )
            if stored is not None and _names(stored.data, turn, step):
                return True, stored.seq
        since = max(0, since_ns - int(CLOCK_MARGIN_S * 1e9)) if since_ns else None
        stored = await next_stored(
            self._nc, self._topology.stream_of(session), subject, since_ns=since
        )
        for _ in range(MAX_FIRSTS):
            if stored is None:
                return False, end
            if _names(stored.data, turn, step):
                return True, stored.seq
            stored = await next_stored(self._nc, stream, subject, after_seq=stored.seq)
        return False, end


def _names(payload: bytes, turn: int, step: int) -> bool:
    """Whether a stored first chunk is the step's."""
    envelope = chunk_envelopes(payload)[0]
    return (envelope.turn, envelope.step) == (turn, step)


async def _followed(
    batches: AsyncGenerator[list[tuple[int, bytes]], None],
    triple: Triple,
    order: _InOrder,
    idle_s: float,
    clock: Callable[[], float] = time.monotonic,
) -> AsyncGenerator[list[ChunkEnvelope], None]:
    """The step's envelopes out of the session's batches, until its finish; idle-bounded."""
    _, turn, step = triple
    progress = clock()
    while not order.finished:
        try:
            async with asyncio.timeout(max(0.0, progress + idle_s - clock())):
                batch = await anext(batches)
        except TimeoutError:
            raise _abandoned(triple, idle_s) from None
        except BrokerError as exc:
            raise BrokerUnavailableError("the broker did not answer", detail=str(exc)) from exc
        mine = [e for _, p in batch for e in chunk_envelopes(p) if (e.turn, e.step) == (turn, step)]
        if ready := order.add(mine):
            progress = clock()
            yield ready


def _abandoned(triple: Triple, idle_s: float) -> StepAbandonedError:
    session, turn, step = triple
    return StepAbandonedError(
        f"step {session}/{turn}/{step} was abandoned: nothing of it came for {idle_s:g} s (its "
        "gateway stopped before the step ended); it is not called again: start a new step"
    )


def _gone(triple: Triple) -> StepGoneError:
    session, turn, step = triple
    return StepGoneError(
        f"step {session}/{turn}/{step} is no longer retained by the broker (or was never "
        "recorded): it cannot be resumed; start a new step"
    )


class MemoryStepSource:
    """The in-memory twin over a :class:`~tokenwire.broker.MemoryPublisher` (unit tests):
    what it holds, then what it is given, polled every ``poll_s`` (bounded by ``idle_s``)."""

    def __init__(self, publisher: MemoryPublisher, poll_s: float = 0.005) -> None:
        self._publisher = publisher
        self._poll = poll_s

    async def chunks(
        self, triple: Triple, since_ns: int, *, idle_s: float, ended: bool
    ) -> AsyncGenerator[list[ChunkEnvelope], None]:
        order, seen = _InOrder(), 0
        progress = time.monotonic()
        while not order.finished:
            messages = self._publisher.messages
            fresh = [m.envelope for m in messages[seen:]]
            seen = len(messages)
            mine = [e for e in fresh if (e.session, e.turn, e.step) == triple]
            if ready := order.add(mine):
                progress = time.monotonic()
                yield ready
            elif ended and order.next == 0:
                raise _gone(triple)
            elif time.monotonic() - progress > idle_s:
                raise _abandoned(triple, idle_s)
            else:
                await asyncio.sleep(self._poll)
