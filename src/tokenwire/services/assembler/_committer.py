"""The commit path: closed steps are batched, committed in one transaction, then acknowledged.

Order of effects for every batch: ``store.commit`` returns -> every message of those steps is
acknowledged -> a ``StepPersisted`` event is published per step. Nothing is acknowledged before
its commit; a failed commit acknowledges nothing and is retried (docs/assembler.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import assert_never

from tokenwire.schemas import Message, RecordedError
from tokenwire.services.assembler._assembly import ClosedStep, StepKey
from tokenwire.services.assembler._consume import Delivery, ack_tokens
from tokenwire.services.assembler._metrics import AssemblerMetrics
from tokenwire.store import (
    CommittedStep,
    StepRecord,
    Store,
    StoreError,
    StoreIntegrityError,
    StoreUnavailable,
)

log = logging.getLogger(__name__)

DeadLetter = Callable[[Sequence[Delivery], str, str], Awaitable[None]]
"""``(tokens, reason, detail)``: dead-letter and terminate the messages of one step."""
Announce = Callable[[CommittedStep], Awaitable[None]]
"""Publish the ``StepPersisted`` event of a committed step."""
Forget = Callable[[StepKey], None]
"""Forget that a step was closed (``Assembly.forget_closed``)."""


@dataclass(slots=True)
class _Waiting:
    closed: ClosedStep[Delivery]
    since: float
    extra: list[Delivery] = field(default_factory=list)

    def tokens(self) -> list[Delivery]:
        return [*self.closed.tokens, *self.extra]


@dataclass(frozen=True, slots=True)
class CommitPolicy:
    """When to commit and how to retry: see AssemblerSettings for the meaning of each field."""

    batch_max_steps: int = 256
    batch_max_s: float = 0.02
    max_pending_steps: int = 20_000
    backoff_initial_s: float = 0.1
    backoff_max_s: float = 5.0


class Committer:
    """Holds closed steps until their batch is committed, then acknowledges their messages.

    ``add`` is synchronous (called from the handlers); :meth:`run` is the one task that
    commits. A step waiting here can still collect tokens (:meth:`attach`): a redelivered
    chunk of it is acknowledged with it, never before its commit.
    """

    def __init__(
        self,
        store: Store,
        policy: CommitPolicy,
        metrics: AssemblerMetrics,
        *,
        announce: Announce,
        dead_letter: DeadLetter,
        forget: Forget = lambda key: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._store = store
        self._forget = forget
        self._policy = policy
        self._metrics = metrics
        self._announce = announce
        self._dead_letter = dead_letter
        self._clock = clock
        self._waiting: OrderedDict[StepKey, _Waiting] = OrderedDict()
        self._wake = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._committed = asyncio.Event()
        self._stopping = False
        self.store_ok = True
        self.set_store_ok(True)  # the gauge agrees from the start (a standby commits nothing)

    # -- called by the handlers ------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Closed steps not yet committed (and acknowledged)."""
        return len(self._waiting)

    @property
    def full(self) -> bool:
        return len(self._waiting) >= self._policy.max_pending_steps

    def add(self, closed: ClosedStep[Delivery]) -> None:
        """Queue a closed step for the next commit."""
        waiting = self._waiting.get(closed.key)
        if waiting is not None:  # closed twice (its key fell out of the closed memory)
            waiting.extra.extend(closed.tokens)
            return
        self._waiting[closed.key] = _Waiting(closed, self._clock())
        self._metrics.pending_steps.set(len(self._waiting))
        if len(self._waiting) >= self._policy.batch_max_steps or len(self._waiting) == 1:
            self._wake.set()
        if self.full:
            self._room.clear()

    def held_tokens(self) -> list[Delivery]:
        """The tokens of every step waiting for its commit."""
        return [token for waiting in self._waiting.values() for token in waiting.tokens()]

    def holds(self, partition: int) -> bool:
        """Whether a step waiting for its commit holds a message of ``partition``."""
        return any(
            t.partition == partition for waiting in self._waiting.values() for t in waiting.tokens()
        )

    async def settle(self, partition: int, timeout_s: float) -> bool:
        """Wait until no waiting step holds a message of ``partition`` (its commits returned
        and were acknowledged); False when that took longer than ``timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.holds(partition):
            self._committed.clear()
            try:
                await asyncio.wait_for(self._committed.wait(), deadline - loop.time())
            except TimeoutError:
                return not self.holds(partition)
        return True

    def attach(self, key: StepKey, token: Delivery) -> bool:
        """Acknowledge ``token`` with the waiting step ``key``; False if none is waiting."""
        waiting = self._waiting.get(key)
        if waiting is None:
            return False
        waiting.extra.append(token)
        return True

    async def wait_for_room(self) -> None:
        """Return once fewer than ``max_pending_steps`` steps wait (back-pressure)."""
        while self.full:
            self._room.clear()
            await self._room.wait()

    # -- the commit task -------------------------------------------------------------------

    async def run(self) -> None:
        """Commit batches forever (cancel to stop; an interrupted batch stays unacknowledged)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._waiting:
                await self._wait_for_batch()
                await self.commit_batch()

    async def _wait_for_batch(self) -> None:
        oldest = next(iter(self._waiting.values())).since
        due = oldest + self._policy.batch_max_s - self._clock()
        if len(self._waiting) < self._policy.batch_max_steps and due > 0:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), due)

    async def flush(self, give_up_after_s: float) -> bool:
        """Commit everything waiting; False if the store stayed down for ``give_up_after_s``."""
        deadline = self._clock() + give_up_after_s
        while self._waiting:
            if self._clock() > deadline:
                return False
            try:
                await asyncio.wait_for(self.commit_batch(), max(0.01, deadline - self._clock()))
            except TimeoutError:
                return False
        return True

    async def commit_batch(self) -> None:
        """Commit the oldest waiting steps (up to a batch), then acknowledge every message of
        them at once (one buffered ``+ACK`` each, no round trip) and announce each step."""
        batch = list(self._waiting.values())[: self._policy.batch_max_steps]
        whole = await self._commit([w.closed.record for w in batch])
        results: list[CommittedStep | None] = (
            list(whole) if whole is not None else await self._commit_one_by_one(batch)
        )
        for waiting in batch:
            # Removed before acknowledging: a chunk of these steps arriving from now on is
            # acknowledged at once by the handler, as the step is durable.
            del self._waiting[waiting.closed.key]
        self._metrics.pending_steps.set(len(self._waiting))
        if not self.full:
            self._room.set()
        done = [(w, r) for w, r in zip(batch, results, strict=True) if r is not None]
        await ack_tokens([token for waiting, _ in done for token in waiting.tokens()])
        self._committed.set()
        for waiting, result in done:
            self._count(waiting.closed, result)
            await self._announce(result)

    async def _commit(self, records: list[StepRecord]) -> list[CommittedStep] | None:
        """Commit with back-off on StoreUnavailable; None when the store rejects the batch."""
        delay = self._policy.backoff_initial_s
        while True:
            started = time.perf_counter()
            try:
                results = await self._store.commit(records)
            except StoreIntegrityError as exc:
                self._store_failed(exc, "integrity")
                return None
            except StoreError as exc:
                # Unavailable, or unusable as configured (a file that is no database, a folder
                # it cannot create: an operator's to fix): waited for like an outage. Let out,
                # it ended this loop, and nothing was committed again while the instance
                # still answered ready.
                label = "unavailable" if isinstance(exc, StoreUnavailable) else "config"
                self._store_failed(exc, label)
            else:
                self._metrics.commit_seconds.observe(time.perf_counter() - started)
                self._metrics.batch_steps.observe(len(records))
                self.set_store_ok(True)
                return results
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._policy.backoff_max_s)

    def _store_failed(self, exc: Exception, label: str) -> None:
        self._metrics.store_failures.labels(label).inc()
        self.set_store_ok(label == "integrity")  # it answered: it is the input that is wrong
        log.warning("commit failed (%s): %s", label, exc)

    def set_store_ok(self, ok: bool) -> None:
        """Whether the last store call succeeded: ``store_ok`` and the ``store_up`` gauge."""
        self.store_ok = ok
        self._metrics.store_up.set(1 if ok else 0)

    async def _commit_one_by_one(self, batch: list[_Waiting]) -> list[CommittedStep | None]:
        """A batch the store rejected: commit each step alone, dead-letter the bad ones.

        A bad step whose messages could not all be dead-lettered (the broker did not take the
        copies) is forgotten as closed: its messages come back after ``ack_wait`` and must
        reach the store and the dead-letter subject again, not settle as duplicates of a step
        that was never stored."""
        results: list[CommittedStep | None] = []
        for waiting in batch:
            single = await self._commit([waiting.closed.record])
            if single is None:
                tokens = waiting.tokens()
                await self._dead_letter(
                    tokens, "store-integrity", f"the store rejected step {waiting.closed.key}"
                )
                if any(t.message is not None and not t.message.resolved for t in tokens):
                    self._forget(waiting.closed.key)
                results.append(None)
            else:
                results.append(single[0])
        return results

    def _count(self, closed: ClosedStep[Delivery], result: CommittedStep) -> None:
        if not result.inserted:
            self._metrics.duplicates.labels("store").inc()
            return
        self._metrics.steps.labels(closed.reason).inc()
        if result.usage is not None:
            self._metrics.usage.count(result.usage)
        outcome = closed.record.outcome
        match outcome:
            case Message():
                self._metrics.messages.inc()
            case RecordedError(kind=kind):
                self._metrics.errors.labels(kind).inc()
            case _:
                assert_never(outcome)
