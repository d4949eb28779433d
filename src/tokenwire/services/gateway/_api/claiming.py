"""A model call's step claim (:func:`step_claim`): an explicit triple, an idempotency key's
step, or the session's next step (docs/gateway.md, "Sessions, turns and steps")."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from tokenwire.broker import StepAllocator
from tokenwire.services.gateway._access.identity import (
    IDEMPOTENCY_HEADER,
    KeyedRequest,
    RequestedIdentity,
    ResumeTarget,
    StepClaim,
    assign_after_call,
    assign_keyed,
    claim_explicit,
)
from tokenwire.services.gateway._dialects import CallerRequest
from tokenwire.services.gateway._errors import InvalidRequestError
from tokenwire.services.gateway._resume.resume import key_hash

_MAX_KEY_CHARS = 255


async def step_claim(
    steps: StepAllocator,
    *,
    wanted: RequestedIdentity,
    session: str,
    req: CallerRequest,
    fp: Callable[[], str],
    headers: Mapping[str, str],
    fresh: bool,
    idempotency_ttl_s: float,
) -> StepClaim | ResumeTarget:
    """The step's claim: an explicit triple is claimed now, so that a 409 never costs a
    provider call (the same request again resumes it); an unnamed request with an
    ``Idempotency-Key`` gets the key's step (resumed) or a new one mapped to the key
    before the provider is called; any other assigned one (never a conflict) is held until
    the provider request is written (:meth:`StepClaim.send`), then sent and answered while
    the provider works (the step waits for it before it publishes); a conversation's first
    call sends it without reading the session's pointer first (``fresh``). ``fp`` makes the
    request's fingerprint, which only the first two keep."""
    if wanted.turn is not None and wanted.step is not None:
        return await claim_explicit(session, wanted.turn, wanted.step, steps, fp())
    key = headers.get(IDEMPOTENCY_HEADER)
    if key is not None:
        keyed = KeyedRequest(
            key_hash=key_hash(_credential(headers), _checked_key(key)),
            fingerprint=fp(),
            ttl_s=idempotency_ttl_s,
        )
        return await assign_keyed(session, steps, keyed, new_turn=not req.ends_with_tool_result)
    return assign_after_call(
        session,
        steps,
        new_turn=not req.ends_with_tool_result,
        fresh=fresh and req.opens_conversation,
    )


def _credential(headers: Mapping[str, str]) -> str:
    """What the caller authenticated with (an idempotency key is scoped to it)."""
    return headers.get("authorization") or headers.get("x-api-key") or ""


def _checked_key(key: str) -> str:
    """An ``Idempotency-Key`` value: 1-255 visible ASCII characters (400 otherwise)."""
    if not 0 < len(key) <= _MAX_KEY_CHARS or not all(" " < c <= "~" for c in key):
        raise InvalidRequestError(
            f"Idempotency-Key must be 1-{_MAX_KEY_CHARS} visible ASCII characters",
            param=IDEMPOTENCY_HEADER,
        )
    return key
