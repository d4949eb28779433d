"""The commit loop outlives what one batch brings: a Committer over a MemoryStore, its loop
running as in the service, watched through its announcements."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec

from tests.assembler.scripts import envelopes, text_step
from tokenwire.schemas import TokenUsage, Usage
from tokenwire.services.assembler import Assembly
from tokenwire.services.assembler._assembly import ClosedStep, StepKey
from tokenwire.services.assembler._committer import CommitPolicy, Committer
from tokenwire.services.assembler._consume import Delivery
from tokenwire.services.assembler._metrics import AssemblerMetrics
from tokenwire.store import CommittedStep, MemoryStore, StepRecord, StoreConfigError


class Announced:
    """The steps announced (committed and acknowledged), and an event per awaited one."""

    def __init__(self) -> None:
        self.keys: list[StepKey] = []
        self._waits: dict[StepKey, asyncio.Event] = {}

    async def __call__(self, result: CommittedStep) -> None:
        key = (result.session, result.turn, result.step)
        self.keys.append(key)
        self._waits.setdefault(key, asyncio.Event()).set()

    async def wait(self, key: StepKey, loop: asyncio.Task[None], timeout_s: float = 5.0) -> None:
        """Until ``key`` is announced; fails when the commit ``loop`` ended first."""
        announced = asyncio.ensure_future(self._waits.setdefault(key, asyncio.Event()).wait())
        await asyncio.wait({announced, loop}, timeout=timeout_s, return_when="FIRST_COMPLETED")
        announced.cancel()
        assert not loop.done(), f"the commit loop ended: {loop.exception()!r}"
        assert key in self.keys, f"{key} not announced within {timeout_s} s"


async def _no_dead_letter(tokens: Sequence[Delivery], reason: str, detail: str) -> None:
    raise AssertionError(f"nothing is dead-lettered here: {reason} {detail}")


class Unusable(MemoryStore):
    """A store whose commits fail as unusable (``StoreConfigError``: what the SQLite store
    raises for a file that is no database, or a folder it cannot create) until ``fixed``."""

    def __init__(self) -> None:
        super().__init__()
        self.fixed = asyncio.Event()
        self.refused = asyncio.Event()

    async def commit(self, records: Sequence[StepRecord]) -> list[CommittedStep]:
        if not self.fixed.is_set():
            self.refused.set()
            raise StoreConfigError("sqlite:///store.db", "file is not a database")
        return await super().commit(records)


def _closed(step: int, usage: TokenUsage) -> ClosedStep[Delivery]:
    assembly: Assembly[Delivery] = Assembly()
    envs = envelopes("s", 0, step, text_step(["a"]))
    envs = [
        msgspec.structs.replace(e, chunk=Usage(usage=usage)) if type(e.chunk) is Usage else e
        for e in envs
    ]
    outcomes = [assembly.feed(e, Delivery(100 * step + i, None)) for i, e in enumerate(envs)]
    closed = outcomes[-1]
    assert isinstance(closed, ClosedStep)
    return closed


async def test_a_negative_token_count_does_not_end_the_commit_loop() -> None:
    """A step whose provider reported a negative count (stored as reported, unpriced) used to
    raise from the usage counter after its commit: the loop ended, every later step waited
    for a commit that never came, and the instance still looked ready."""
    store, announced = MemoryStore(), Announced()
    committer = Committer(
        store,
        CommitPolicy(batch_max_s=0.0),
        AssemblerMetrics(),
        announce=announced,
        dead_letter=_no_dead_letter,
    )
    loop = asyncio.create_task(committer.run())
    try:
        committer.add(_closed(0, TokenUsage(input_tokens=-3, output_tokens=1)))
        await announced.wait(("s", 0, 0), loop)
        committer.add(_closed(1, TokenUsage(input_tokens=12, output_tokens=1)))
        await announced.wait(("s", 0, 1), loop)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert announced.keys == [("s", 0, 0), ("s", 0, 1)]
    assert await store.step_outcome("s", 0, 1) is not None


async def test_an_unusable_store_is_waited_for_not_the_end_of_the_commit_loop() -> None:
    """A commit refused as unusable (not unavailable, not a bad record) escaped the loop's
    retry: the loop ended, with the store gauge still up. It is retried like an outage, the
    instance not ready meanwhile, and the step is committed once the store is usable."""
    store, announced = Unusable(), Announced()
    policy = CommitPolicy(batch_max_s=0.0, backoff_initial_s=0.001, backoff_max_s=0.001)
    committer = Committer(
        store, policy, AssemblerMetrics(), announce=announced, dead_letter=_no_dead_letter
    )
    loop = asyncio.create_task(committer.run())
    try:
        committer.add(_closed(0, TokenUsage(input_tokens=12, output_tokens=1)))
        refused = asyncio.ensure_future(store.refused.wait())
        await asyncio.wait({refused, loop}, timeout=5.0, return_when="FIRST_COMPLETED")
        refused.cancel()
        assert store.refused.is_set()  # raised in the loop's own step: it has handled it now
        assert not loop.done(), f"the commit loop ended: {loop.exception()!r}"
        assert not committer.store_ok
        store.fixed.set()
        await announced.wait(("s", 0, 0), loop)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert committer.store_ok
    assert await store.step_outcome("s", 0, 0) is not None
