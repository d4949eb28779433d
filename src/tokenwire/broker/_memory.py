"""In-memory twins of the publisher, the step registry, the session owners and the shared
cooldowns, for unit tests of the gateway alone. They raise the real exceptions
(``BrokerUnavailable``, ``StepClaimConflict``) and pass the same contract suite as the real
ones (tests/broker/test_twins.py); they never replace the broker in a test that claims the
system works.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import msgspec

from tokenwire.broker._cooldowns import (
    Cooling,
    DeploymentState,
    Healthy,
    ProbeClaim,
    ProbeDue,
    Probing,
    ttl_header,
)
from tokenwire.broker._errors import BrokerUnavailable, PayloadTooLarge, StepClaimConflict
from tokenwire.broker._frames import header_size
from tokenwire.broker._owners import Owner
from tokenwire.broker._publisher import PublisherStats
from tokenwire.broker._step_record import (
    AMBIGUOUS,
    KeyBinding,
    StepNames,
    StepRecord,
    ThreadMark,
)
from tokenwire.broker._topology import msg_id
from tokenwire.schemas import ChunkEnvelope, chunk_envelopes


@dataclass
class Published:
    """One chunk as the in-memory publisher received it, with the message that carried it
    (``raw``, ``first``, ``headers`` are the message's: shared by the chunks of a frame)."""

    envelope: ChunkEnvelope
    first: bool
    headers: dict[str, str]
    raw: bytes


@dataclass
class MemoryPublisher:
    """Records every publish: ``messages`` one entry per chunk (a frame's chunks each),
    ``frames`` one per message; ``fail_after`` makes publishes past that many messages raise,
    and ``fail_acks`` every ``wait_acked`` (both ``BrokerUnavailable``)."""

    messages: list[Published] = field(default_factory=list)
    frames: list[bytes] = field(default_factory=list)
    fail_after: int | None = None
    fail_acks: bool = False
    max_payload: int = 1024 * 1024

    async def publish(
        self,
        envelope_bytes: bytes,
        session: str,
        turn: int,
        step: int,
        ordinal: int,
        *,
        first: bool,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Record the message, or raise BrokerUnavailable once ``fail_after`` is reached, or
        PayloadTooLarge (nothing recorded) past ``max_payload`` as the real one does."""
        if self.fail_after is not None and len(self.frames) >= self.fail_after:
            raise BrokerUnavailable("memory://", "configured to fail")
        copied = dict(headers or {})
        head = header_size({**copied, "Nats-Msg-Id": msg_id(session, turn, step, ordinal)})
        if head + len(envelope_bytes) > self.max_payload:
            raise PayloadTooLarge(
                session, head + len(envelope_bytes), self.max_payload, self.max_payload - head
            )
        for envelope in chunk_envelopes(envelope_bytes):
            self.messages.append(Published(envelope, first, copied, envelope_bytes))
        self.frames.append(envelope_bytes)

    async def wait_acked(
        self, session: str, turn: int, step: int, timeout_s: float | None = None
    ) -> None:
        """Acked at once, unless ``fail_acks``."""
        if self.fail_acks:
            raise BrokerUnavailable("memory://", "acks configured to fail")

    def stats(self) -> PublisherStats:
        """All published, all acked (counted in messages, as the real one counts)."""
        n = len(self.frames)
        return PublisherStats(n, n, 0, 0, 0, 0)


@dataclass
class MemoryStepRegistry:
    """Claims triples in a set; assigns as :class:`~tokenwire.broker.StepRegistry` does."""

    claimed: set[tuple[str, int, int]] = field(default_factory=set)
    latest: dict[str, tuple[int, int]] = field(default_factory=dict)
    records: dict[tuple[str, int, int], StepRecord] = field(default_factory=dict)
    bindings: dict[str, KeyBinding] = field(default_factory=dict)
    idle_s: float = 0.0
    clock_ns: Callable[[], int] = time.time_ns
    marks: dict[str, ThreadMark] = field(default_factory=dict)
    mark_reads: int = 0

    async def claim(self, session: str, turn: int, step: int, fingerprint: str = "") -> None:
        """Claim the triple or raise :class:`StepClaimConflict`."""
        if (session, turn, step) in self.claimed:
            raise StepClaimConflict(session, turn, step)
        self._claimed((session, turn, step), fingerprint)

    async def begin_next_step(
        self, session: str, new_turn: bool, fingerprint: str = "", *, fresh: bool = False
    ) -> Assigned:
        """Assigned at once: (0, 0) first; then (turn + 1, 0) for a new turn, else
        (turn, step + 1), skipping claimed triples."""
        turn, step = self.latest.get(session, (-1, -1))
        candidate = (0, 0) if turn < 0 else (turn + 1, 0) if new_turn else (turn, step + 1)
        while (session, *candidate) in self.claimed:
            candidate = (candidate[0], candidate[1] + 1)
        self._claimed((session, *candidate), fingerprint)
        self.latest[session] = candidate
        return Assigned(candidate)

    def _claimed(self, triple: tuple[str, int, int], fingerprint: str) -> None:
        self.claimed.add(triple)
        token = f"memory.{len(self.claimed)}"
        self.records[triple] = StepRecord(
            token, fingerprint, idle_s=self.idle_s, time_ns=self.clock_ns()
        )

    async def record(self, session: str, turn: int, step: int) -> StepRecord | None:
        """The claim's record, None when never claimed."""
        return self.records.get((session, turn, step))

    async def name_step(self, session: str, turn: int, step: int, names: StepNames) -> None:
        """Keep the answer's names with the claim."""
        record = self.records.get((session, turn, step))
        if record is not None:
            self.records[(session, turn, step)] = msgspec.structs.replace(record, names=names)

    async def bind_key(self, key_hash: str, binding: KeyBinding, ttl_s: float) -> KeyBinding:
        """Map the key unless a mapping younger than ``ttl_s`` holds; the one in force."""
        held = await self.key_binding(key_hash, ttl_s)
        if held is not None:
            return held
        self.bindings[key_hash] = msgspec.structs.replace(binding, time_ns=time.time_ns())
        return binding

    async def key_binding(self, key_hash: str, ttl_s: float) -> KeyBinding | None:
        """The mapping, if younger than ``ttl_s``."""
        held = self.bindings.get(key_hash)
        if held is None or time.time_ns() - held.time_ns >= ttl_s * 1e9:
            return None
        return held

    async def thread_mark(self, key_hash: str) -> ThreadMark | None:
        """The mark under the key (counted in ``mark_reads``)."""
        self.mark_reads += 1
        return self.marks.get(key_hash)

    async def mark_thread(self, key_hashes: Sequence[str], mark: ThreadMark) -> None:
        """Put the mark under each key; a key naming another session becomes ambiguous."""
        for key_hash in key_hashes:
            held = self.marks.get(key_hash)
            if held is None or (not held.ambiguous and held.session == mark.session):
                self.marks[key_hash] = mark
            else:
                self.marks[key_hash] = AMBIGUOUS

    def pointer(self, session: str) -> tuple[int, int, int] | None:
        """No revisions here: never known."""
        return None

    def recall(self, session: str, pointer: tuple[int, int, int]) -> None:
        """Nothing to remember (the latest step is always known)."""


@dataclass(frozen=True)
class Assigned:
    """An assignment already made (the in-memory registry's pending step)."""

    triple: tuple[int, int]

    async def result(self) -> tuple[int, int]:
        """The assigned (turn, step)."""
        return self.triple

    def drop(self) -> None:
        """Nothing to forget."""


@dataclass
class MemorySessionOwners:
    """Owners in two dicts: ``retained`` (what the stream's first retained steps would name;
    a test fills it) and ``records`` (the owner records, first writer wins)."""

    retained_owners: dict[str, Owner] = field(default_factory=dict)
    records: dict[str, Owner] = field(default_factory=dict)

    async def retained(self, session: str) -> Owner | None:
        """The owner of the session's first retained step, if any."""
        return self.retained_owners.get(session)

    async def adopt(self, session: str, owner: Owner) -> Owner:
        """``owner`` unless a record exists; the recorded owner."""
        return self.records.setdefault(session, owner)


@dataclass
class MemoryCooldowns:
    """The shared cooldowns in a dict, one board for every gateway of a test that shares it.

    A state's TTL ends by a timer on the running loop (``ttl_header`` seconds, as the broker
    counts them), or at once with :meth:`expire`. Watchers are called synchronously, in the
    order the states are stored.
    """

    clock_ns: Callable[[], int] = time.time_ns
    _states: dict[str, DeploymentState] = field(default_factory=dict)
    _revision: int = 0
    _watchers: list[Callable[[DeploymentState], None]] = field(default_factory=list)
    _timers: dict[str, asyncio.TimerHandle] = field(default_factory=dict)

    async def cool(self, deployment: str, *, reason: str, seconds: float) -> None:
        """Hold the deployment back for ``seconds``."""
        until = self.clock_ns() + int(seconds * 1e9)
        self._store(Cooling(deployment, self._next(), until, reason), seconds)

    async def claim_probe(self, deployment: str, *, revision: int, seconds: float) -> ProbeClaim:
        """Win the probe when the state is still at ``revision``."""
        if self._revision_of(deployment) != revision:
            return ProbeClaim(False, await self.state(deployment))
        until = self.clock_ns() + int(seconds * 1e9)
        probing = Probing(deployment, self._next(), until)
        self._store(probing, seconds)
        return ProbeClaim(True, probing)

    async def clear(self, deployment: str) -> None:
        """Healthy."""
        self._store(Healthy(deployment, self._next()), None)

    async def state(self, deployment: str) -> DeploymentState:
        """The stored state (healthy at revision 0 when none)."""
        return self._states.get(deployment) or Healthy(deployment, 0)

    async def states(self) -> list[DeploymentState]:
        """Every stored state, by deployment name."""
        return [self._states[name] for name in sorted(self._states)]

    async def watch(self, on_state: Callable[[DeploymentState], None]) -> MemoryWatch:
        """Every stored state now, then each change."""
        for name in sorted(self._states):
            on_state(self._states[name])
        self._watchers.append(on_state)
        return MemoryWatch(self._watchers, on_state)

    async def ensure(self) -> bool:
        """Always there."""
        return True

    def expire(self, deployment: str) -> None:
        """End the deployment's TTL now (a cooling or probing state becomes due for a probe)."""
        timer = self._timers.pop(deployment, None)
        if timer is not None:
            timer.cancel()
        if isinstance(self._states.get(deployment), (Cooling, Probing)):
            self._store(ProbeDue(deployment, self._next()), None)

    def _store(self, state: DeploymentState, ttl_s: float | None) -> None:
        timer = self._timers.pop(state.deployment, None)
        if timer is not None:
            timer.cancel()
        self._states[state.deployment] = state
        if ttl_s is not None:
            delay = float(ttl_header(ttl_s).removesuffix("s"))
            loop = asyncio.get_running_loop()
            self._timers[state.deployment] = loop.call_later(delay, self.expire, state.deployment)
        for watcher in list(self._watchers):
            watcher(state)

    def _revision_of(self, deployment: str) -> int:
        state = self._states.get(deployment)
        return 0 if state is None else state.revision

    def _next(self) -> int:
        self._revision += 1
        return self._revision


@dataclass
class MemoryWatch:
    """A watch of :class:`MemoryCooldowns`."""

    watchers: list[Callable[[DeploymentState], None]]
    on_state: Callable[[DeploymentState], None]

    async def stop(self) -> None:
        """No more calls."""
        if self.on_state in self.watchers:
            self.watchers.remove(self.on_state)
