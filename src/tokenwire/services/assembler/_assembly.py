"""Assembly: the pure core of the assembler (no broker, no store, no event loop).

Envelopes go in with an opaque acknowledgement token each; closed steps come out as
:class:`~tokenwire.store.StepRecord` values with the tokens to acknowledge once the record
is committed. The same core serves ``tokenwire rebuild``, which feeds a session read back
from the retained stream; for complete steps the close order depends only on feed order.
"""

from __future__ import annotations

import itertools
import operator
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeAlias, TypeVar

from tokenwire.fold import (
    DEFAULT_LIMITS,
    Added,
    FoldLimits,
    InvalidOrdinal,
    ReorderWindowError,
    StepCollector,
)
from tokenwire.schemas import ChunkEnvelope, Finish
from tokenwire.services.assembler._errors import AssemblyFullError
from tokenwire.store import StepRecord
from tokenwire.variables import (
    ASSEMBLER_ABANDON_TIMEOUT_S,
    ASSEMBLER_GAP_TIMEOUT_S,
    ASSEMBLER_MAX_OPEN_STEPS,
)

T = TypeVar("T", bound=Hashable)

StepKey: TypeAlias = tuple[str, int, int]
"""(session, turn, step): one model call."""

CloseReason = Literal["complete", "gap", "abandoned"]
"""Why a step closed: its finish and every chunk before it arrived, or a timeout."""

PoisonReason = Literal["undecodable", "beyond-finish", "invalid-ordinal", "reorder-window"]
"""Why a message cannot be assembled and goes to the dead-letter subject.

- ``undecodable``: the payload is not a ChunkEnvelope (the service decodes; the core never
  sees these, the reason is listed here so the whole dead-letter vocabulary is in one place).
- ``beyond-finish``: the chunk's ordinal comes after the step's finish (adapter contract).
- ``invalid-ordinal``: a negative ordinal.
- ``reorder-window``: the ordinal is too far ahead of the missing ones to be buffered.
"""

NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class AssemblyConfig:
    """Bounds and timeouts of one :class:`Assembly`.

    - ``max_open_steps``: steps held in memory at once. At the bound :meth:`Assembly.has_room`
      is False for a chunk that would open a new step; the service stops taking messages
      until a step closes (back-pressure, docs/assembler.md). Chunks of open steps still fit.
    - ``gap_timeout_s``: a step whose finish arrived but whose earlier chunks did not is
      closed as ``RecordedError(kind="gap")`` after this long without a new chunk.
    - ``abandon_timeout_s``: a step without its finish is closed as ``abandoned`` after this
      long without a new chunk (a crashed gateway).
    - ``closed_memory``: how many closed step keys are remembered, to recognise redelivered
      and late chunks without asking the store (least recently closed forgotten first).
    """

    max_open_steps: int = ASSEMBLER_MAX_OPEN_STEPS.value
    gap_timeout_s: float = ASSEMBLER_GAP_TIMEOUT_S.value
    abandon_timeout_s: float = ASSEMBLER_ABANDON_TIMEOUT_S.value
    closed_memory: int = 100_000
    fold_limits: FoldLimits = DEFAULT_LIMITS

    def __post_init__(self) -> None:
        for name in ("max_open_steps", "closed_memory"):
            if getattr(self, name) < 1:
                raise ValueError(f"AssemblyConfig.{name} must be at least 1")
        for name in ("gap_timeout_s", "abandon_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"AssemblyConfig.{name} must be positive")


@dataclass(frozen=True, slots=True)
class ClosedStep(Generic[T]):
    """A step ready to commit: its record and the tokens of every message that carried it."""

    record: StepRecord
    tokens: tuple[T, ...]
    reason: CloseReason

    @property
    def key(self) -> StepKey:
        r = self.record
        return (r.session, r.turn, r.step)


@dataclass(frozen=True, slots=True)
class Poisoned(Generic[T]):
    """A message that can never be assembled: dead-letter it, then terminate it."""

    token: T
    reason: PoisonReason
    detail: str
    key: StepKey | None = None


@dataclass(frozen=True, slots=True)
class Settled(Generic[T]):
    """A chunk of a step this assembly already closed (a redelivery or a duplicate publish).

    Acknowledge it once that step's commit is durable. ``late`` means the step was closed by
    a timeout (gap, abandoned) and this chunk arrived after it: it is counted, not stored.
    """

    token: T
    key: StepKey
    late: bool = False


_CHUNK = operator.attrgetter("chunk")

Outcome: TypeAlias = ClosedStep[T] | Poisoned[T] | Settled[T]
"""What feeding one envelope produced (None: the chunk is held in an open step)."""


@dataclass(frozen=True, slots=True)
class FedFrame(Generic[T]):
    """What feeding a frame produced: whether any of its chunks was taken into its step (held
    there, or closing it), and the outcomes that are not None, in chunk order."""

    taken: bool
    outcomes: list[Outcome[T]]


@dataclass(frozen=True, slots=True)
class DueStep:
    """An open step past its timeout, not closed yet (:meth:`Assembly.due`): the service
    decides whether it can still finish (``_expiry.py``) before it closes it.

    ``last_chunk_ns``: the gateway time of the newest chunk held (its envelope's ``time_ns``).
    """

    key: StepKey
    reason: CloseReason
    last_chunk_ns: int


@dataclass(slots=True)
class _OpenStep(Generic[T]):
    collector: StepCollector
    provider: str
    model: str
    last_ns: int
    envelopes: dict[int, ChunkEnvelope] = field(default_factory=dict)
    tokens: dict[T, T] = field(default_factory=dict)
    finish_at: int | None = None


@dataclass(frozen=True, slots=True)
class _Tombstone:
    finish_at: int | None
    reason: CloseReason


class Assembly(Generic[T]):
    """Per-(session, turn, step) collectors over a stream of envelopes; pure and synchronous.

    ``feed`` takes envelopes in delivery order (duplicates and reorders allowed) and returns
    at most one :data:`Outcome`; ``expire`` closes steps that waited too long. Tokens are
    opaque, hashable acknowledgement handles: tokens that compare equal (the same broker
    message delivered again) are kept once, the latest wins.

    >>> from tokenwire.schemas import TextDelta
    >>> a: Assembly[int] = Assembly(clock=lambda: 0)
    >>> env = lambda o, c: ChunkEnvelope("s", 0, 0, o, 0, "p", "m", c)
    >>> a.feed(env(1, Finish(reason="stop")), 11) is None
    True
    >>> closed = a.feed(env(0, TextDelta(index=0, text="hi")), 10)
    >>> closed.record.outcome.text, closed.tokens
    ('hi', (11, 10))
    """

    def __init__(
        self, config: AssemblyConfig | None = None, clock: Callable[[], int] = time.time_ns
    ) -> None:
        self.config = config or AssemblyConfig()
        self._clock = clock
        self._open: OrderedDict[StepKey, _OpenStep[T]] = OrderedDict()
        self._closed: OrderedDict[StepKey, _Tombstone] = OrderedDict()
        self._gap_ns = int(self.config.gap_timeout_s * NS)
        self._abandon_ns = int(self.config.abandon_timeout_s * NS)

    # -- queries -------------------------------------------------------------------------

    @property
    def open_steps(self) -> int:
        """How many steps are open (waiting for chunks)."""
        return len(self._open)

    def is_open(self, key: StepKey) -> bool:
        """Whether the step is open here."""
        return key in self._open

    def knows(self, key: StepKey) -> bool:
        """Whether the step is open here or was closed here recently (see ``closed_memory``)."""
        return key in self._open or key in self._closed

    def has_room(self, envelope: ChunkEnvelope) -> bool:
        """False when feeding ``envelope`` would open a step beyond ``max_open_steps``."""
        if len(self._open) < self.config.max_open_steps:
            return True
        return self.knows((envelope.session, envelope.turn, envelope.step))

    def held_tokens(self) -> list[T]:
        """The tokens of every open step (to hand their messages back at shutdown)."""
        return [token for step in self._open.values() for token in step.tokens.values()]

    def drop_open(self, sessions: Callable[[str], bool]) -> list[T]:
        """Forget the open steps of the sessions ``sessions`` selects, without closing them
        (their partition was handed to another instance); returns their tokens to hand back."""
        keys = [key for key in self._open if sessions(key[0])]
        return [token for key in keys for token in self._open.pop(key).tokens.values()]

    def remember_closed(self, key: StepKey) -> None:
        """Record that the step was closed elsewhere (found in the store): its chunks settle."""
        self._tombstone(key, _Tombstone(None, "complete"))

    def forget_closed(self, key: StepKey) -> None:
        """Forget that the step was closed here (neither stored nor dead-lettered): its chunks,
        when delivered again, assemble it again instead of settling as duplicates."""
        self._closed.pop(key, None)

    # -- feeding -------------------------------------------------------------------------

    def feed(self, envelope: ChunkEnvelope, token: T) -> Outcome[T] | None:
        """Take one chunk. Returns the step it closed, a poison or settled verdict, or None.

        Raises :class:`AssemblyFullError` when the chunk would open a step beyond the bound
        (check :meth:`has_room` first).
        """
        key = (envelope.session, envelope.turn, envelope.step)
        step = self._open.get(key)
        if step is None:
            tomb = self._closed.get(key)
            if tomb is not None:
                return _settle(tomb, key, envelope, token)
            step = self._start(key, envelope)
        try:
            added = step.collector.add(envelope.ordinal, envelope.chunk)
        except (InvalidOrdinal, ReorderWindowError) as exc:
            return self._reject(key, step, exc, token)
        return self._on_added(key, step, added, envelope, token)

    def feed_frame(self, envelopes: Sequence[ChunkEnvelope], token: T) -> FedFrame[T]:
        """:meth:`feed` of each of a frame's envelopes under one token. They are one step's, at
        consecutive ordinals, as ``ChunkFrame.envelopes`` builds them (what
        ``chunk_envelopes`` returns for any stored message).

        The common case, a frame continuing its step in order (``StepCollector.add_run``),
        keeps every chunk with the token, the activity clock and the step's order touched
        once; anything else (a gap, a duplicate, a finish inside, a closed step) takes the
        chunks one by one, as ``feed`` would. Raises :class:`AssemblyFullError` as ``feed``.
        """
        first = envelopes[0]
        key = (first.session, first.turn, first.step)
        step = self._open.get(key)
        if step is None and first.ordinal == 0 and key not in self._closed:
            step = self._start(key, first)
        if step is not None and step.collector.add_run(first.ordinal, list(map(_CHUNK, envelopes))):
            step.envelopes.update(zip(itertools.count(first.ordinal), envelopes, strict=False))
            self._keep(key, step, envelopes[-1], token)
            if step.collector.complete:
                return FedFrame(True, [self._close(key, step, "complete", self._clock())])
            return FedFrame(True, [])
        outcomes = [self.feed(envelope, token) for envelope in envelopes]
        taken = any(o is None or type(o) is ClosedStep for o in outcomes)
        return FedFrame(taken, [o for o in outcomes if o is not None])

    def _start(self, key: StepKey, envelope: ChunkEnvelope) -> _OpenStep[T]:
        if len(self._open) >= self.config.max_open_steps:
            raise AssemblyFullError(len(self._open), self.config.max_open_steps)
        collector = StepCollector(self.config.fold_limits)
        step: _OpenStep[T] = _OpenStep(collector, envelope.provider, envelope.model, self._clock())
        self._open[key] = step
        return step

    def _on_added(
        self, key: StepKey, step: _OpenStep[T], added: Added, envelope: ChunkEnvelope, token: T
    ) -> Outcome[T] | None:
        match added:
            case Added.ACCEPTED | Added.BUFFERED:
                self._keep(key, step, envelope, token)
                if step.collector.complete:
                    return self._close(key, step, "complete", self._clock())
                return None
            case Added.DUPLICATE:
                step.tokens[token] = token  # the latest delivery of an equal token wins
                return None
            case Added.BEYOND_FINISH:
                self._drop_if_empty(key, step)
                detail = f"ordinal {envelope.ordinal} after the finish at {step.finish_at}"
                return Poisoned(token, "beyond-finish", detail, key)
            case Added.CLOSED:  # pragma: no cover - failed steps leave _open at once
                return Settled(token, key, late=True)

    def _keep(self, key: StepKey, step: _OpenStep[T], envelope: ChunkEnvelope, token: T) -> None:
        ordinal = envelope.ordinal
        step.envelopes[ordinal] = envelope
        step.tokens[token] = token
        step.last_ns = self._clock()
        self._open.move_to_end(key)  # _open stays ordered by last activity, for expire()
        if type(envelope.chunk) is Finish and (step.finish_at is None or ordinal < step.finish_at):
            step.finish_at = ordinal

    def _reject(self, key: StepKey, step: _OpenStep[T], exc: Exception, token: T) -> Poisoned[T]:
        self._drop_if_empty(key, step)
        reason: PoisonReason = (
            "invalid-ordinal" if isinstance(exc, InvalidOrdinal) else "reorder-window"
        )
        return Poisoned(token, reason, str(exc), key)

    def _drop_if_empty(self, key: StepKey, step: _OpenStep[T]) -> None:
        if not step.envelopes:
            del self._open[key]

    # -- closing -------------------------------------------------------------------------

    def expire(self, now_ns: int) -> list[ClosedStep[T]]:
        """Close the steps that waited too long, least recently active first.

        A step whose finish arrived closes as ``gap`` after ``gap_timeout_s`` without a new
        chunk; one without its finish closes as ``abandoned`` after ``abandon_timeout_s``.
        (The service asks the broker first: :meth:`due`; ``tokenwire rebuild`` closes them.)
        """
        return [
            self._close(key, self._open[key], reason, now_ns)
            for key, reason in self._overdue(now_ns)
        ]

    def _overdue(self, now_ns: int) -> list[tuple[StepKey, CloseReason]]:
        soonest = now_ns - min(self._gap_ns, self._abandon_ns)
        found: list[tuple[StepKey, CloseReason]] = []
        for key, step in self._open.items():
            if step.last_ns > soonest:
                break  # ordered by activity: every later step is younger still
            reason = self._overdue_for(step, now_ns)
            if reason is not None:
                found.append((key, reason))
        return found

    def _overdue_for(self, step: _OpenStep[T], now_ns: int) -> CloseReason | None:
        reason: CloseReason = "gap" if step.finish_at is not None else "abandoned"
        timeout = self._gap_ns if reason == "gap" else self._abandon_ns
        return reason if step.last_ns <= now_ns - timeout else None

    def due(self, now_ns: int) -> list[DueStep]:
        """The open steps :meth:`expire` would close at ``now_ns``, least recently active
        first, left open: close each with :meth:`close_due`, keep waiting with :meth:`touch`,
        or hand it back with :meth:`drop_step`."""
        return [
            DueStep(key, reason, _newest(self._open[key])) for key, reason in self._overdue(now_ns)
        ]

    def close_due(self, due: DueStep, now_ns: int) -> ClosedStep[T] | None:
        """Close a step :meth:`due` listed; None when it is no longer open or no longer due
        (a chunk came meanwhile)."""
        step = self._open.get(due.key)
        reason = None if step is None else self._overdue_for(step, now_ns)
        if step is None or reason is None:
            return None
        return self._close(due.key, step, reason, now_ns)

    def touch(self, key: StepKey, now_ns: int) -> None:
        """Count the step as active at ``now_ns``: its timeout starts again (it may still
        finish: this instance is behind, or its gateway may still publish)."""
        step = self._open.get(key)
        if step is not None:
            step.last_ns = now_ns
            self._open.move_to_end(key)

    def drop_step(self, key: StepKey) -> list[T]:
        """Forget one open step without closing it; its tokens, to hand back (its partition
        is another instance's now)."""
        step = self._open.pop(key, None)
        return [] if step is None else list(step.tokens.values())

    def close_all(self, now_ns: int) -> list[ClosedStep[T]]:
        """Close every open step now (``gap`` or ``abandoned``): the end of a finite read."""
        return [
            self._close(key, step, "gap" if step.finish_at is not None else "abandoned", now_ns)
            for key, step in list(self._open.items())
        ]

    def _close(
        self, key: StepKey, step: _OpenStep[T], reason: CloseReason, now_ns: int
    ) -> ClosedStep[T]:
        del self._open[key]
        self._tombstone(key, _Tombstone(step.finish_at, reason))
        if reason == "complete":
            outcome = step.collector.result()
        else:
            outcome = step.collector.fail(reason, _failure_message(step, reason, self.config))
        last = step.finish_at if step.finish_at is not None else max(step.envelopes, default=-1)
        record = StepRecord(
            session=key[0],
            turn=key[1],
            step=key[2],
            provider=step.provider,
            model=step.model,
            chunks=[step.envelopes[o] for o in sorted(step.envelopes) if o <= last],
            outcome=outcome,
            completed_ns=now_ns,
        )
        return ClosedStep(record, tuple(step.tokens.values()), reason)

    def _tombstone(self, key: StepKey, tomb: _Tombstone) -> None:
        self._closed[key] = tomb
        self._closed.move_to_end(key)
        if len(self._closed) > self.config.closed_memory:
            self._closed.popitem(last=False)


def _newest(step: _OpenStep[T]) -> int:
    """The gateway time of the newest chunk a step holds."""
    return max((e.time_ns for e in step.envelopes.values()), default=0)


def _settle(tomb: _Tombstone, key: StepKey, envelope: ChunkEnvelope, token: T) -> Outcome[T]:
    """A chunk of a closed step: settled, or poison when it lies beyond the step's finish."""
    if tomb.finish_at is not None and envelope.ordinal > tomb.finish_at:
        detail = f"ordinal {envelope.ordinal} after the finish at {tomb.finish_at}"
        return Poisoned(token, "beyond-finish", detail, key)
    return Settled(token, key, late=tomb.reason != "complete")


def _failure_message(step: _OpenStep[T], reason: CloseReason, config: AssemblyConfig) -> str:
    if reason == "gap":
        missing = step.collector.missing()
        shown = ", ".join(map(str, missing[:20])) + (", ..." if len(missing) > 20 else "")
        return (
            f"ordinals [{shown}] before the finish at {step.finish_at} never arrived "
            f"within {config.gap_timeout_s:g} s"
        )
    highest = max(step.envelopes, default=-1)
    return (
        f"no finish and no new chunk for {config.abandon_timeout_s:g} s "
        f"(last ordinal {highest}, {len(step.envelopes)} chunks)"
    )
