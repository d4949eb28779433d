"""The surfaces the gateway needs of the broker, as Protocols, with two implementations each:
the real ones (:class:`~tokenwire.broker.ChunkPublisher`, :class:`~tokenwire.broker.StepRegistry`)
and their in-memory twins (``_memory.py``) for unit tests of the gateway alone. One contract
suite (tests/broker/test_twins.py) runs both, as the store's does for its three.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from tokenwire.broker._allowances import Change, Pool
from tokenwire.broker._cooldowns import DeploymentState, ProbeClaim
from tokenwire.broker._keys import EntryKind, KeyEntry
from tokenwire.broker._owners import Owner
from tokenwire.broker._publisher import PublisherStats
from tokenwire.broker._step_record import KeyBinding, StepNames, StepRecord, ThreadMark
from tokenwire.schemas import KeyRecord, TenantRecord


class ChunkSink(Protocol):
    """Pipelined publishing of a step's chunks (one message each, or frames of several:
    ``ordinal`` is then the frame's first, which names its ``Nats-Msg-Id``).

    ``publish`` returns once the chunk is on the wire and waits only when the bounded window is
    full; ``wait_acked`` returns when every chunk of the step is acknowledged or raises the
    step's :class:`~tokenwire.broker.BrokerError` (``PublishError`` leaves, or
    ``BrokerUnavailable``).
    """

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
    ) -> None: ...

    async def wait_acked(
        self, session: str, turn: int, step: int, timeout_s: float | None = None
    ) -> None: ...

    def stats(self) -> PublisherStats: ...

    @property
    def max_payload(self) -> int:
        """The largest message (payload and header block together) the broker takes now."""
        ...


class PendingAssignment(Protocol):
    """An assignment already sent: ``result`` waits for the claimed (turn, step); ``drop``
    forgets it unread."""

    async def result(self) -> tuple[int, int]: ...

    def drop(self) -> None: ...


class StepAllocator(Protocol):
    """Unique (session, turn, step) triples across gateway instances.

    ``claim`` raises :class:`~tokenwire.broker.StepClaimConflict` when the triple was claimed
    before; ``begin_next_step`` sends the assignment of the next one (a new session (0, 0); a
    new turn (turn + 1, 0); else (turn, step + 1); triples claimed explicitly are skipped) and
    returns before its answer (``fresh``: the request looks like its conversation's first
    call, a hint that the session is new; the result is the same either way). A registry that
    does not answer raises another :class:`~tokenwire.broker.StepRegistryError`.

    Each claim keeps a :class:`~tokenwire.broker.StepRecord`: the request's ``fingerprint``
    (given to ``claim`` / ``begin_next_step``) and, once ``name_step`` ran, how the answer was
    named; ``record`` reads it (None: never claimed). ``bind_key`` maps an idempotency key
    to a step unless a mapping younger than ``ttl_s`` exists (it returns the one in force);
    ``key_binding`` reads it.

    Thread keys (the gateway's threading of unnamed requests): ``thread_mark`` reads the
    :class:`~tokenwire.broker.ThreadMark` under a key (one read), ``mark_thread`` puts a
    step's mark under its keys (a key that names another session becomes ambiguous);
    ``pointer`` / ``recall`` hand a session's remembered step pointer over through a mark.
    """

    async def claim(self, session: str, turn: int, step: int, fingerprint: str = "") -> None: ...

    async def begin_next_step(
        self, session: str, new_turn: bool, fingerprint: str = "", *, fresh: bool = False
    ) -> PendingAssignment: ...

    async def record(self, session: str, turn: int, step: int) -> StepRecord | None: ...

    async def name_step(self, session: str, turn: int, step: int, names: StepNames) -> None: ...

    async def bind_key(self, key_hash: str, binding: KeyBinding, ttl_s: float) -> KeyBinding: ...

    async def key_binding(self, key_hash: str, ttl_s: float) -> KeyBinding | None: ...

    async def thread_mark(self, key_hash: str) -> ThreadMark | None: ...

    async def mark_thread(self, key_hashes: Sequence[str], mark: ThreadMark) -> None: ...

    def pointer(self, session: str) -> tuple[int, int, int] | None: ...

    def recall(self, session: str, pointer: tuple[int, int, int]) -> None: ...


class SessionOwnership(Protocol):
    """Whose a session is (``broker._owners``): ``retained`` names the owner on the session's
    first retained step (None: the stream holds none); ``adopt`` records an owner for a
    session the stream does not hold yet, unless one is recorded, and returns the recorded
    one (the first writer's). A broker that does not answer raises
    :class:`~tokenwire.broker.BrokerError`."""

    async def retained(self, session: str) -> Owner | None: ...

    async def adopt(self, session: str, owner: Owner) -> Owner: ...


class BoardWatch(Protocol):
    """A running watch of the shared cooldowns; ``stop`` ends it."""

    async def stop(self) -> None: ...


class CooldownBoard(Protocol):
    """The deployments' shared cooldowns (``broker._cooldowns``; ``MemoryCooldowns`` is the
    twin): ``cool`` holds a deployment back for every gateway; once that ends, one
    ``claim_probe`` (compare-and-set on the :class:`~tokenwire.broker.ProbeDue` revision)
    wins the one probe; ``clear`` marks it healthy; ``watch`` tells every change as it is
    stored, after every deployment's current state; ``ensure`` makes the bucket again where
    the process may (True: it answers). A broker that does not answer raises
    :class:`~tokenwire.broker.BrokerError`."""

    async def cool(self, deployment: str, *, reason: str, seconds: float) -> None: ...

    async def claim_probe(
        self, deployment: str, *, revision: int, seconds: float
    ) -> ProbeClaim: ...

    async def clear(self, deployment: str) -> None: ...

    async def state(self, deployment: str) -> DeploymentState: ...

    async def states(self) -> list[DeploymentState]: ...

    async def watch(self, on_state: Callable[[DeploymentState], None]) -> BoardWatch: ...

    async def ensure(self) -> bool: ...


class KeyBook(Protocol):
    """The gateway keys and tenants (``broker._keys``; ``MemoryKeys`` is the twin): ``entry``
    reads one (None: never written), ``entries`` all of them (deleted ones too); ``write``
    stores a record (None: deletes it) when the entry is still at revision ``expected`` (0:
    never written; None: whatever it is) and returns the new revision, None when it was not;
    ``watch`` tells every entry now, then each change; ``last_revision`` is the bucket's last
    (a watcher that saw less is behind); ``ensure`` makes the bucket again where the process
    may (True: it answers). A broker that does not answer raises
    :class:`~tokenwire.broker.BrokerError`."""

    async def entry(self, kind: EntryKind, name: str) -> KeyEntry | None: ...

    async def entries(self) -> list[KeyEntry]: ...

    async def write(
        self,
        kind: EntryKind,
        name: str,
        record: KeyRecord | TenantRecord | None,
        *,
        expected: int | None,
    ) -> int | None: ...

    async def watch(self, on_entry: Callable[[KeyEntry], None]) -> BoardWatch: ...

    async def last_revision(self) -> int: ...

    async def ensure(self) -> bool: ...


class AllowanceBoard(Protocol):
    """The keys' and tenants' shared allowances (``broker._allowances``;
    ``MemoryAllowances`` is the twin): ``update`` applies a change to one counter by
    compare-and-set (retried on conflict), ``read`` and ``pools`` read them back. A broker
    that does not answer raises :class:`~tokenwire.broker.BrokerError`."""

    async def update(self, key: str, change: Change, *, ttl_s: float) -> Pool: ...

    async def read(self, key: str) -> Pool: ...

    async def pools(self) -> dict[str, Pool]: ...
