"""``StepRegistry``: unique (session, turn, step) triples across gateway instances, on JetStream KV.

Keys: ``<session>.<turn>.<step>`` marks a claimed triple (created once: KV create fails when
the key exists); ``<session>`` holds the latest assigned ``{"turn": t, "step": s}``, advanced
by compare-and-set (update with the revision read). The claim key decides who owns a triple;
the pointer only says where the next assignment starts. A session's keys all live in one of
the registry's R buckets (``TOKENWIRE_REGISTRY_SHARDS``, :class:`~tokenwire.broker.Topology`),
so every write and read of an assignment goes to that bucket's raft group alone. Writes go
through :class:`KvWriter` (sent at once, acked by callback); reads through nats-py's
``KeyValue``.

Riding out a leader election: while the bucket has no leader (its node killed, an election
under load) a write gets no ack (or a "no leader" / 503 answer). Every such failure is retried,
at most ``retries`` times and within ``retry_s`` seconds of the assignment's start, with a
pause doubling from 0.25 s to 2 s; the same writes are sent again (the same candidate from the
same base), so a write that had landed unacknowledged is found, not doubled: each claim key
holds a token of the assignment that wrote it, and a claim that "already exists" after a resend
is read back from the bucket's leader to see whose it is. Past the bound the last failure is
raised (the gateway answers 503 with ``retry-after``).
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeVar

import msgspec
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.errors import Error as JsError
from nats.js.errors import KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from tokenwire.broker._errors import (
    StepAssignmentContention,
    StepClaimConflict,
    StepRegistryError,
    TopologyError,
)
from tokenwire.broker._kvwrite import KvWriter
from tokenwire.broker._step_record import (
    AMBIGUOUS,
    KeyBinding,
    StepNames,
    StepRecord,
    ThreadMark,
    decode_binding,
    decode_mark,
    decode_record,
    encode_binding,
    encode_mark,
    encode_record,
    key_binding_key,
    thread_key,
)
from tokenwire.broker._topology import Topology, registry_shard_of

DEFAULT_RETRIES = 16
DEFAULT_RETRY_S = 30.0
"""The bound of the retries that ride out a leader election (the count and the total time of
one assignment or claim); a stream leader election under load took 8-14 s in the fault tier."""
_FIRST_PAUSE_S, _MAX_PAUSE_S = 0.25, 2.0
_T = TypeVar("_T")


class _Budget:
    """What one assignment or claim may still spend on retries (count and deadline)."""

    def __init__(self, retries: int, retry_s: float) -> None:
        self._left = retries
        self._retries = retries
        self._retry_s = retry_s
        self._deadline = time.monotonic() + retry_s
        self._pause = _FIRST_PAUSE_S

    def wait_s(self, timeout_s: float) -> float:
        """One wait for the broker, cut at the deadline (never below 50 ms)."""
        return max(0.05, min(timeout_s, self._deadline - time.monotonic()))

    async def spend(self, exc: StepRegistryError) -> None:
        """Pause before the next try; ``exc`` (with the bound spent) once none is left."""
        if isinstance(exc, (StepClaimConflict, StepAssignmentContention)):
            raise exc  # answers, not failures
        left_s = self._deadline - time.monotonic()
        if self._left <= 0 or left_s <= 0:
            raise StepRegistryError(
                f"{exc} (after {self._retries - self._left} retries within {self._retry_s} s)"
            ) from exc
        self._left -= 1
        await asyncio.sleep(min(self._pause, left_s))
        self._pause = min(self._pause * 2, _MAX_PAUSE_S)

    async def run(self, call: Callable[[], Awaitable[_T]]) -> _T:
        """``call()`` until it does not fail with StepRegistryError, within the bound."""
        while True:
            try:
                return await call()
            except StepRegistryError as exc:
                await self.spend(exc)


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
    base: _Known  # the pointer it was computed from
    token: bytes  # the claim key's value: whose claim it is
    resent: bool = False  # sent again after a failure: "it existed" may mean "it is ours"
    guessed: bool = False  # from no pointer, unread: "the session is new" was a guess

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
        self,
        registry: StepRegistry,
        session: str,
        new_turn: bool,
        first: _Attempt | None,
        fingerprint: str = "",
    ) -> None:
        self._registry = registry
        self._session = session
        self._new_turn = new_turn
        self._first = first
        self._fingerprint = fingerprint

    async def result(self) -> tuple[int, int]:
        """The claimed (turn, step); StepRegistryError or StepAssignmentContention."""
        first, self._first = self._first, None
        return await self._registry.assign(self._session, self._new_turn, first, self._fingerprint)

    def drop(self) -> None:
        """Not needed after all: the first attempt's acks are ignored (its triple stays unused)."""
        if self._first is not None:
            self._first.drop()
            self._first = None


@dataclass(frozen=True, slots=True)
class RegistryBucket:
    """One of the registry's KV buckets: nats-py's ``KeyValue`` reads, :class:`KvWriter`
    writes."""

    kv: KeyValue
    writer: KvWriter

    @property
    def stream(self) -> str:
        """The bucket's stream (``KV_<bucket>``), read from its leader."""
        return f"KV_{self.writer.bucket}"

    def subject(self, key: str) -> str:
        """``key``'s subject in the bucket (``$KV.<bucket>.<key>``)."""
        return f"$KV.{self.writer.bucket}.{key}"


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

    ``buckets`` are the registry's shards (``Topology.registry_buckets``, in order): a
    session's keys live in ``buckets[partition_of(session, R)]``, an idempotency key's binding
    in ``buckets[partition_of(key_hash, R)]``, as :meth:`Topology.registry_bucket_of` says.
    """

    def __init__(
        self,
        buckets: Sequence[RegistryBucket],
        max_attempts: int = 64,
        remembered: int = 65536,
        timeout_s: float = 5.0,
        *,
        retries: int = DEFAULT_RETRIES,
        retry_s: float = DEFAULT_RETRY_S,
        js: JetStreamContext | None = None,
        idle_s: float = 0.0,
    ) -> None:
        if not buckets:
            raise ValueError("a step registry needs at least one bucket")
        self._buckets = tuple(buckets)
        self._max_attempts = max_attempts
        self._remembered = remembered
        self._timeout = timeout_s
        self._retries = retries
        self._retry_s = retry_s
        self._js = js  # reads from the bucket's leader (None: the KV's own reads)
        self._idle_s = idle_s  # kept with every claim (StepRecord.idle_s)
        prefix = uuid.uuid4().hex[:12]  # this registry's: a claim's token is it and a count
        self._tokens = (f"{prefix}.{n}" for n in itertools.count())
        self._known: OrderedDict[str, tuple[int, _Latest]] = OrderedDict()

    @classmethod
    async def open(
        cls,
        nc: Client,
        topology: Topology,
        max_attempts: int = 64,
        *,
        retries: int = DEFAULT_RETRIES,
        retry_s: float = DEFAULT_RETRY_S,
        idle_s: float = 0.0,
    ) -> StepRegistry:
        """Bind to the buckets ``ensure_topology`` created; ``retries`` and ``retry_s`` bound
        the retries of one assignment or claim (see the module); ``idle_s``, the gateway's
        bound on a step's silence, is kept with every claim (``StepRecord.idle_s``)."""
        buckets: list[RegistryBucket] = []
        try:
            for name in topology.registry_buckets:
                try:
                    kv = await nc.jetstream().key_value(name)
                except JsError as exc:
                    raise TopologyError(f"bucket {name}", str(exc)) from exc
                buckets.append(RegistryBucket(kv, await KvWriter(nc, name).start()))
        except BaseException:
            await asyncio.gather(*(b.writer.close() for b in buckets))
            raise
        return cls(
            buckets,
            max_attempts,
            retries=retries,
            retry_s=retry_s,
            js=nc.jetstream(),
            idle_s=idle_s,
        )

    def _of(self, key: str) -> RegistryBucket:
        """The bucket holding a session's keys (or an idempotency key's binding)."""
        buckets = self._buckets
        return buckets[0] if len(buckets) == 1 else buckets[registry_shard_of(key, len(buckets))]

    def _budget(self) -> _Budget:
        return _Budget(self._retries, self._retry_s)

    async def close(self) -> None:
        """Stop listening for acks (writes still waiting fail)."""
        await asyncio.gather(*(b.writer.close() for b in self._buckets))

    async def claim(self, session: str, turn: int, step: int, fingerprint: str = "") -> None:
        """Claim the triple for this caller; StepClaimConflict if anyone claimed it before.
        ``fingerprint`` (the request's) is kept with the claim (:meth:`record`)."""
        budget, triple = self._budget(), _Latest(turn, step)
        token = self._value(fingerprint)
        resent = False
        while True:
            try:
                created = await self._settled(
                    await self._create_claim(session, triple, token), budget.wait_s(self._timeout)
                )
                break
            except StepRegistryError as exc:
                await budget.spend(exc)
                resent = True
        if created is None and not (
            resent and await budget.run(lambda: self._ours(session, triple, token))
        ):
            raise StepClaimConflict(session, turn, step)

    async def next_step(self, session: str, new_turn: bool) -> tuple[int, int]:
        """Assign and claim the session's next (turn, step).

        A new session starts at (0, 0); otherwise ``new_turn`` gives (turn + 1, 0) and a
        continuation (turn, step + 1). Triples claimed explicitly by someone else are skipped.
        """
        return await (await self.begin_next_step(session, new_turn)).result()

    async def begin_next_step(
        self, session: str, new_turn: bool, fingerprint: str = "", *, fresh: bool = False
    ) -> PendingStep:
        """:meth:`next_step` in two halves: the first attempt is sent (when the session's
        pointer is remembered, or guessed absent) before this returns;
        :meth:`PendingStep.result` finishes it. ``fingerprint`` is kept with the claim of the
        step assigned.

        ``fresh``: the request looks like its conversation's first call, so a session not
        remembered is guessed new: its first step (0, 0) is sent at once, as if its pointer had
        been read absent, saving that read's round trip. A wrong guess costs one failed attempt
        before the read; if only the claim key's create landed (the session exists and its
        (0, 0) claim expired, or another gateway created the session at the same moment), that
        claim is left unused (see :meth:`assign`)."""
        known = self._known.pop(session, None)
        first = None
        if known is not None:
            first = await self._attempt(session, known, new_turn, fingerprint)
        elif fresh:
            first = await self._attempt(session, (None, None), new_turn, fingerprint)
            first.guessed = True
        return PendingStep(self, session, new_turn, first, fingerprint)

    def _value(self, fingerprint: str) -> bytes:
        """A fresh claim value: a token of its own and the request's fingerprint."""
        return encode_record(StepRecord(next(self._tokens), fingerprint, idle_s=self._idle_s))

    async def assign(
        self, session: str, new_turn: bool, first: _Attempt | None, fingerprint: str = ""
    ) -> tuple[int, int]:
        """Run attempts (``first`` already sent, if any) until one triple is ours; failures
        of the broker are retried within the bound (see the module).

        A guessed first attempt (``begin_next_step(fresh=True)``) whose claim key was created
        but whose pointer existed is adopted only when the pointer names (0, 0) itself (our
        own create, landed before a lost ack, or another gateway's that created the session at
        the same moment and lost the claim): a pointer past it may mean that the session's
        (0, 0) claim expired with the bucket's TTL while later steps kept the pointer alive,
        so the claim stays unused (a gap, as a dropped assignment leaves) and the pointer is
        read."""
        attempt, known, budget = first, None, self._budget()
        for _ in range(self._max_attempts):
            if attempt is None:
                known = (
                    known if known is not None else await budget.run(lambda: self._read(session))
                )
                attempt = await self._attempt(session, known, new_turn, fingerprint)
            candidate, guessed = attempt.candidate, attempt.guessed
            moved, claimed = await self._outcome(session, attempt, budget)
            attempt = None
            if claimed and moved is None and guessed:
                moved = await budget.run(partial(self._adopt_guess, session, candidate))
                if moved is None:
                    known = None  # the session existed after all
                    continue
            if claimed and moved is None:  # another assignment moved the pointer meanwhile
                moved = await budget.run(partial(self._adopt, session, candidate))
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

    async def _attempt(
        self, session: str, known: _Known, new_turn: bool, fingerprint: str
    ) -> _Attempt:
        candidate = _following(known[1], new_turn)
        return await self._send(session, candidate, known, self._value(fingerprint))

    async def _send(self, session: str, candidate: _Latest, base: _Known, token: bytes) -> _Attempt:
        moved = await self._move(session, candidate, base[0])
        try:
            claimed = await self._create_claim(session, candidate, token)
        except BaseException:
            moved.cancel()
            raise
        return _Attempt(candidate, moved, claimed, base, token)

    async def _outcome(
        self, session: str, attempt: _Attempt, budget: _Budget
    ) -> tuple[int | None, bool]:
        """The attempt's outcome; on a failure the same writes are sent again (bounded). A
        resent claim that existed is ours if it holds our token (the first send had landed)."""
        while True:
            try:
                moved, claimed = await attempt.outcome(budget.wait_s(self._timeout))
                break
            except StepRegistryError as exc:
                await budget.spend(exc)
                attempt = await budget.run(
                    partial(self._send, session, attempt.candidate, attempt.base, attempt.token)
                )
                attempt.resent = True
        if not claimed and attempt.resent:
            token = attempt.token
            claimed = await budget.run(lambda: self._ours(session, attempt.candidate, token))
        return moved, claimed

    async def _ours(self, session: str, triple: _Latest, token: bytes) -> bool:
        """Whether the triple's claim key holds ``token``, read from the bucket's leader."""
        key = f"{session}.{triple.turn}.{triple.step}"
        stored = await self._leader_read(self._of(session), key)
        return stored is not None and decode_record(stored[0]).token == decode_record(token).token

    async def _leader_read(self, bucket: RegistryBucket, key: str) -> tuple[bytes, int, int] | None:
        """(value, revision, stored time ns) of ``key`` read from ``bucket``'s leader; None
        when absent (or deleted)."""
        try:
            if self._js is None:
                entry = await bucket.kv.get(key)
                return entry.value or b"", entry.revision or 0, 0
            msg = await self._js.get_last_msg(bucket.stream, bucket.subject(key))
        except NotFoundError:  # KeyNotFoundError too
            return None
        except (JsError, NatsError, TimeoutError) as exc:
            raise StepRegistryError(f"read {key}: {exc!r}") from exc
        if msg.headers and msg.headers.get("KV-Operation") in ("DEL", "PURGE"):
            return None
        stamp = int(msg.time.timestamp() * 1e9) if msg.time is not None else 0
        return msg.data or b"", msg.seq or 0, stamp

    # -- what is kept with a claim, and idempotency keys (broker/_step_record.py) ----------

    async def record(self, session: str, turn: int, step: int) -> StepRecord | None:
        """The claim's record (read from the bucket's leader); None when never claimed (or
        expired with the bucket's TTL)."""
        key, bucket = f"{session}.{turn}.{step}", self._of(session)
        stored = await self._budget().run(lambda: self._leader_read(bucket, key))
        return None if stored is None else decode_record(stored[0], stored[2])

    async def name_step(self, session: str, turn: int, step: int, names: StepNames) -> None:
        """Keep how the step's answer was named with its claim (one read and one write)."""
        key, bucket = f"{session}.{turn}.{step}", self._of(session)
        stored = await self._leader_read(bucket, key)
        if stored is None:
            return
        record = msgspec.structs.replace(decode_record(stored[0]), names=names)
        await self._settled(await bucket.writer.put_if(key, encode_record(record), stored[1]))

    async def bind_key(self, key_hash: str, binding: KeyBinding, ttl_s: float) -> KeyBinding:
        """Map an idempotency key to ``binding`` unless it maps to a step already (within
        ``ttl_s`` of that mapping: an older one is replaced); returns the binding in force."""
        key, bucket = key_binding_key(key_hash), self._of(key_hash)
        value = encode_binding(binding)
        for _ in range(self._max_attempts):
            stored = await self._leader_read(bucket, key)
            last = 0
            if stored is not None:
                held = decode_binding(stored[0], stored[2])
                if held is not None and time.time_ns() - held.time_ns < ttl_s * 1e9:
                    return held
                last = stored[1]
            if await self._settled(await bucket.writer.put_if(key, value, last)) is not None:
                return binding
        raise StepAssignmentContention(key, self._max_attempts)

    async def key_binding(self, key_hash: str, ttl_s: float) -> KeyBinding | None:
        """The step an idempotency key maps to, if it does (and was mapped within ``ttl_s``)."""
        stored = await self._leader_read(self._of(key_hash), key_binding_key(key_hash))
        if stored is None:
            return None
        held = decode_binding(stored[0], stored[2])
        if held is None or time.time_ns() - held.time_ns >= ttl_s * 1e9:
            return None
        return held

    # -- thread keys (the gateway's threading, ``_access/threads.py``) ----------------------

    async def thread_mark(self, key_hash: str) -> ThreadMark | None:
        """The mark under a thread key: one read from its bucket's leader; None when none."""
        stored = await self._leader_read(self._of(key_hash), thread_key(key_hash))
        return None if stored is None else decode_mark(stored[0])

    async def mark_thread(self, key_hashes: Sequence[str], mark: ThreadMark) -> None:
        """Put ``mark`` under each thread key: every key created at once (one round trip);
        a key that existed is read and moved to this step when it names the same session,
        made :data:`AMBIGUOUS` when it names another."""
        value = encode_mark(mark)
        sent = []
        for key_hash in key_hashes:
            writer = self._of(key_hash).writer
            sent.append((key_hash, await writer.put_if(thread_key(key_hash), value, last=0)))
        for key_hash, write in sent:
            if await self._settled(write) is None:
                await self._remark(key_hash, mark)

    async def _remark(self, key_hash: str, mark: ThreadMark) -> None:
        bucket, key = self._of(key_hash), thread_key(key_hash)
        for _ in range(self._max_attempts):
            stored = await self._leader_read(bucket, key)
            value, last = encode_mark(mark), 0
            if stored is not None:
                held = decode_mark(stored[0])
                if held.ambiguous:
                    return
                if held.session != mark.session:
                    value = encode_mark(AMBIGUOUS)
                last = stored[1]
            if await self._settled(await bucket.writer.put_if(key, value, last)) is not None:
                return
        raise StepAssignmentContention(key, self._max_attempts)

    def pointer(self, session: str) -> tuple[int, int, int] | None:
        """The session's step pointer as this instance last knew it: ``(revision, turn,
        step)``; None when not remembered."""
        known = self._known.get(session)
        return None if known is None else (known[0], known[1].turn, known[1].step)

    def recall(self, session: str, pointer: tuple[int, int, int]) -> None:
        """Take ``pointer`` (from a thread mark) as the session's, unless one is remembered:
        the next assignment tries it first (a stale one fails its compare-and-set)."""
        if session not in self._known:
            revision, turn, step = pointer
            self._remember(session, revision, _Latest(turn, step))

    def _remember(self, session: str, revision: int, latest: _Latest) -> None:
        self._known[session] = (revision, latest)
        if len(self._known) > self._remembered:
            self._known.popitem(last=False)

    async def _read(self, session: str) -> _Known:
        try:
            entry = await self._of(session).kv.get(session)
        except KeyNotFoundError:
            return None, None
        except (JsError, NatsError, TimeoutError) as exc:  # a read timeout is not a JsError
            raise StepRegistryError(f"read {session}: {exc!r}") from exc
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

    async def _adopt_guess(self, session: str, candidate: _Latest) -> int | None:
        """The pointer's revision when it names ``candidate`` itself (see :meth:`assign`)."""
        revision, latest = await self._read(session)
        return revision if latest == candidate else None

    async def _create_claim(
        self, session: str, triple: _Latest, token: bytes
    ) -> asyncio.Future[int | None]:
        """Send the triple's claim key create, holding ``token`` (resolves to None if the key
        existed)."""
        key = f"{session}.{triple.turn}.{triple.step}"
        return await self._of(session).writer.put_if(key, token, last=0)

    async def _move(
        self, session: str, value: _Latest, revision: int | None
    ) -> asyncio.Future[int | None]:
        """Send the pointer's compare-and-set from ``revision`` (absent: None); resolves to
        its new revision, or None when someone moved it first."""
        writer = self._of(session).writer
        return await writer.put_if(session, msgspec.json.encode(value), last=revision or 0)

    async def _settled(
        self, write: asyncio.Future[int | None], timeout_s: float | None = None
    ) -> int | None:
        timeout_s = self._timeout if timeout_s is None else timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                return await write
        except TimeoutError:
            raise StepRegistryError(f"no KV ack within {round(timeout_s, 2)} s") from None
