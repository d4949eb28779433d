"""Session identity: the (session, turn, step) of a request, from headers or assigned.

Headers: ``X-Tokenwire-Session`` (letters, digits, ``-``, ``_``; 1-128), ``X-Tokenwire-Turn``
and ``X-Tokenwire-Step`` (integers >= 0, given together or not at all). An explicit triple is
claimed (409 if used before); a missing one is assigned by the step allocator, consistently
across gateway instances: a new turn when the request's last message is the user's, the next
step of the same turn when it returns tool results.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field

from tokenwire.broker import (
    BrokerError,
    KeyBinding,
    PendingAssignment,
    StepAllocator,
    StepClaimConflict,
    StepRecord,
)
from tokenwire.services.gateway._errors import (
    BrokerUnavailableError,
    InvalidRequestError,
    StepConflictError,
    StepGoneError,
)

IDEMPOTENCY_HEADER = "idempotency-key"
SESSION_HEADER = "x-tokenwire-session"
TURN_HEADER = "x-tokenwire-turn"
STEP_HEADER = "x-tokenwire-step"
_SESSION = re.compile(r"[A-Za-z0-9_-]{1,128}")
_COUNT = re.compile(r"[0-9]{1,15}")


@dataclass(frozen=True, slots=True)
class StepIdentity:
    """One model call; ``explicit`` when the caller named the turn and step (a retry of the
    same request, once claimed, is refused with 409)."""

    session: str
    turn: int
    step: int
    explicit: bool = field(default=False, compare=False)

    def headers(self) -> dict[str, str]:
        """The three response headers echoing the identity."""
        return {
            "X-Tokenwire-Session": self.session,
            "X-Tokenwire-Turn": str(self.turn),
            "X-Tokenwire-Step": str(self.step),
        }


@dataclass(frozen=True, slots=True)
class RequestedIdentity:
    """What the headers asked for; ``None`` where absent."""

    session: str | None
    turn: int | None
    step: int | None


def read_identity(headers: Mapping[str, str]) -> RequestedIdentity:
    """Validate the tokenwire headers (400 on a malformed one) without claiming anything."""
    session = headers.get(SESSION_HEADER)
    if session is not None and not _SESSION.fullmatch(session):
        raise InvalidRequestError(
            "X-Tokenwire-Session must be 1-128 letters, digits, '-' or '_'", param=SESSION_HEADER
        )
    turn = _count(headers, TURN_HEADER)
    step = _count(headers, STEP_HEADER)
    if (turn is None) != (step is None):
        raise InvalidRequestError(
            "X-Tokenwire-Turn and X-Tokenwire-Step must be given together", param=TURN_HEADER
        )
    if turn is not None and session is None:
        raise InvalidRequestError("an explicit turn and step need X-Tokenwire-Session")
    return RequestedIdentity(session, turn, step)


def _count(headers: Mapping[str, str], name: str) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    if not _COUNT.fullmatch(value):
        raise InvalidRequestError(f"{name} must be an integer >= 0", param=name)
    return int(value)


class StepClaim:
    """A step's identity: known (an explicit triple, claimed) or being assigned.

    An assignment made by :func:`assign_after_call` is held until :meth:`send`, which the app
    calls once the provider request is written: its writes, and then its answer (read by a
    task of its own), run beside the provider. The step awaits :meth:`identity` only when it
    publishes its first chunk, which by then is known unless the provider answered sooner
    than the registry; a step that ends before calls :meth:`drop`.
    """

    def __init__(
        self,
        session: str,
        *,
        known: StepIdentity | None = None,
        pending: PendingAssignment | None = None,
        unsent: Callable[[], Awaitable[PendingAssignment]] | None = None,
    ) -> None:
        self.session = session
        self._known = known
        self._pending = pending
        self._unsent = unsent
        self._answer: asyncio.Future[tuple[int, int]] | None = None

    @property
    def known(self) -> StepIdentity | None:
        """The identity once claimed."""
        return self._known

    async def send(self) -> None:
        """Send the assignment held back, if any, and read its answer in a task of its own;
        :class:`BrokerUnavailableError` (503) when its writes cannot be sent."""
        if self._unsent is not None:
            unsent, self._unsent = self._unsent, None
            try:
                self._pending = await unsent()
            except BrokerError as exc:
                raise _unavailable(exc) from exc
        if self._pending is not None and self._answer is None:
            self._answer = asyncio.ensure_future(self._pending.result())

    async def identity(self) -> StepIdentity:
        """The claimed identity; :class:`BrokerUnavailableError` (503) when the registry
        does not answer."""
        if self._known is None:
            if self._unsent is not None:
                await self.send()
            turn, step = await self._answered()
            self._known = StepIdentity(self.session, turn, step)
        return self._known

    async def _answered(self) -> tuple[int, int]:
        """The assignment's (turn, step): from the task reading it, else read now."""
        answer, pending = self._answer, self._pending
        self._answer, self._pending = None, None
        if pending is None:  # an earlier wait for it was cancelled: never answered
            raise BrokerUnavailableError("the step registry did not answer the step's claim")
        try:
            return await (answer if answer is not None else pending.result())
        except BrokerError as exc:
            raise _unavailable(exc) from exc

    def drop(self) -> None:
        """The step ended before it needed its identity: forget a running assignment (an
        answer already in leaves its triple unused, as a dropped one may)."""
        self._unsent = None
        if self._answer is not None:
            answer, self._answer = self._answer, None
            if not answer.cancel() and not answer.cancelled():
                answer.exception()  # done: its failure, if any, is retrieved
        if self._pending is not None:
            self._pending.drop()
            self._pending = None


@dataclass(frozen=True, slots=True)
class ResumeTarget:
    """A claimed step that a request resumes (the same request again), with its claim's
    record (``_resume/resume.py``)."""

    identity: StepIdentity
    record: StepRecord


async def claim_explicit(
    session: str, turn: int, step: int, steps: StepAllocator, fingerprint: str = ""
) -> StepClaim | ResumeTarget:
    """Claim an explicit triple, keeping the request's ``fingerprint`` with it. Claimed
    before: the same request resumes it (:class:`ResumeTarget`), another one is a
    :class:`StepConflictError` (409); :class:`BrokerUnavailableError` (503) when the registry
    does not answer."""
    try:
        await steps.claim(session, turn, step, fingerprint)
    except StepClaimConflict as exc:
        return await _resumed(steps, KeyBinding(session, turn, step, fingerprint), exc)
    except BrokerError as exc:
        raise _unavailable(exc) from exc
    return StepClaim(session, known=StepIdentity(session, turn, step, explicit=True))


async def _resumed(
    steps: StepAllocator, wanted: KeyBinding, cause: Exception | None = None, why: str = ""
) -> ResumeTarget:
    """The claimed step ``wanted`` names, when its record holds the same fingerprint."""
    session, turn, step = wanted.session, wanted.turn, wanted.step
    try:
        record = await steps.record(session, turn, step)
    except BrokerError as exc:
        raise _unavailable(exc) from exc
    if record is None:
        raise StepGoneError(f"step {session}/{turn}/{step} is no longer claimed (expired)")
    if not wanted.fingerprint or record.fingerprint != wanted.fingerprint:
        why = why or " by a different request (another body or endpoint)"
        raise StepConflictError(session, turn, step, why) from cause
    return ResumeTarget(StepIdentity(session, turn, step, explicit=True), record)


async def assign_next(
    session: str,
    steps: StepAllocator,
    *,
    new_turn: bool,
    fingerprint: str = "",
    fresh: bool = False,
) -> StepClaim:
    """Send the assignment of the session's next step (a new turn, or the next step of this
    one; ``fresh``: a conversation's first call, see ``StepAllocator``); the claim's
    :meth:`StepClaim.identity` gives it. :class:`BrokerUnavailableError` (503) when the
    registry does not answer."""
    try:
        pending = await steps.begin_next_step(session, new_turn, fingerprint, fresh=fresh)
    except BrokerError as exc:
        raise _unavailable(exc) from exc
    return StepClaim(session, pending=pending)


def assign_after_call(
    session: str, steps: StepAllocator, *, new_turn: bool, fresh: bool = False
) -> StepClaim:
    """:func:`assign_next`, held until the provider request is written
    (:meth:`StepClaim.send`): an assigned step never conflicts, so nothing about it can
    refuse the request, and its writes are left off the way to the provider."""

    def unsent() -> Awaitable[PendingAssignment]:
        return steps.begin_next_step(session, new_turn, fresh=fresh)

    return StepClaim(session, unsent=unsent)


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyedRequest:
    """An unnamed request carrying an ``Idempotency-Key``: the key's hash (scoped to the
    caller's credential), the request's fingerprint, how long a key maps to its step."""

    key_hash: str
    fingerprint: str
    ttl_s: float


async def assign_keyed(
    session: str, steps: StepAllocator, keyed: KeyedRequest, *, new_turn: bool
) -> StepClaim | ResumeTarget:
    """The step an idempotency key maps to (resumed; a different request with the key is a
    409), or a new one assigned now and mapped to the key before the provider is called.
    Two requests with one key at once: the second to map it resumes the first's step, and
    the step it was assigned stays claimed, unused."""
    try:
        held = await steps.key_binding(keyed.key_hash, keyed.ttl_s)
        if held is not None:
            return await _resumed(steps, _wanted(held, keyed), why=_KEY_CONFLICT)
        claim = await assign_next(session, steps, new_turn=new_turn, fingerprint=keyed.fingerprint)
        mine = await claim.identity()
        binding = KeyBinding(mine.session, mine.turn, mine.step, keyed.fingerprint)
        bound = await steps.bind_key(keyed.key_hash, binding, keyed.ttl_s)
    except BrokerError as exc:
        raise _unavailable(exc) from exc
    if (bound.session, bound.turn, bound.step) != (mine.session, mine.turn, mine.step):
        return await _resumed(steps, _wanted(bound, keyed), why=_KEY_CONFLICT)
    return claim


_KEY_CONFLICT = " by a different request with the same Idempotency-Key"


def _wanted(held: KeyBinding, keyed: KeyedRequest) -> KeyBinding:
    """What a request with the key asks for: the bound step, with the request's fingerprint
    (a different one is a conflict)."""
    fingerprint = keyed.fingerprint if held.fingerprint == keyed.fingerprint else ""
    return KeyBinding(held.session, held.turn, held.step, fingerprint)


def _unavailable(exc: BrokerError) -> BrokerUnavailableError:
    return BrokerUnavailableError("the step registry is unavailable", detail=str(exc))
