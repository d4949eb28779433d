"""Whether a model call may add a step to the session it names (``X-Tokenwire-Session``).

A session belongs to one tenant: the tenant its steps are recorded with (``ChunkEnvelope.
tenant`` on each step's first chunk). A caller adds steps only to sessions of its own tenant
(operators included: they read every session, they write into their own tenant's), so a
session's steps never mix tenants. A session the request does not name is new (the gateway
makes its id) and needs no check.

For a named session, in order (``broker.SessionOwnership``): the owner of its first retained
step on the broker; if the stream holds none, the owner record in the step registry's KV bucket,
created by the first writer (so two tenants naming the same new id at once cannot both write).
A caller of another tenant gets :class:`SessionNotFoundError`, a 404 in its dialect, before
anything is claimed, published or sent to a provider: an explicit triple's 409 would tell it
the session exists. The refusal itself does tell it that the id is taken (any answer but
success would): ids the gateway makes are random (uuid4); callers that name their own should
make them unguessable too (docs/gateway.md, "Keys and tenants").

Answers are remembered (at most ``remembered`` sessions, each for ``fresh_s``), so a session
this gateway served before costs no broker round trip. Nothing is checked when no key has a
tenant (no keys, or only the flat list): every session is then tenant-less.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from tokenwire.broker import BrokerError, Owner, SessionOwnership
from tokenwire.services.gateway._access.identity import SESSION_HEADER
from tokenwire.services.gateway._access.keys import Caller
from tokenwire.services.gateway._errors import BrokerUnavailableError, SessionNotFoundError

REMEMBERED = 65536
FRESH_S = 3600.0
"""How long a remembered owner is trusted: a session whose steps all left the broker's
retention and whose record aged out may be taken by another tenant; an hour-old memory cannot
outlive that by more than an hour."""


class SessionGuard:
    """Admits or refuses a caller's step in a session (see the module)."""

    def __init__(
        self,
        owners: SessionOwnership | None,
        *,
        active: bool,
        monotonic: Callable[[], float] = time.monotonic,
        remembered: int = REMEMBERED,
        fresh_s: float = FRESH_S,
    ) -> None:
        self._owners = owners
        self._active = active
        self._monotonic = monotonic
        self._remembered = remembered
        self._fresh_s = fresh_s
        self._known: OrderedDict[str, tuple[str | None, float]] = OrderedDict()

    def check_tenants(self, active: bool) -> None:
        """Check (or stop checking) sessions' tenants: whether any key now has a tenant."""
        self._active = active

    async def admit(self, caller: Caller, session: str, *, named: bool) -> None:
        """Return when ``caller`` may add a step to ``session``; :class:`SessionNotFoundError`
        (404) when the session is another tenant's, :class:`BrokerUnavailableError` (503)
        when the broker does not answer."""
        if not self._active:
            return
        if not named:  # an id the gateway just made: nobody else can have written it
            self._remember(session, caller.tenant)
            return
        tenant = self._recalled(session)
        if tenant is None or tenant[0] != caller.tenant:
            owner = await self._owner(session, Owner(caller.tenant))
            self._remember(session, owner.tenant)
            if owner.tenant != caller.tenant:
                raise SessionNotFoundError(session, param=SESSION_HEADER)

    async def may_read(self, caller: Caller, session: str) -> bool:
        """Whether ``caller`` may read ``session``'s steps: an operator reads every tenant's,
        a tenant its own (:class:`BrokerUnavailableError` when the broker does not answer).
        Nothing is recorded: a read never makes a session anybody's."""
        if not self._active or caller.operator:
            return True
        recalled = self._recalled(session)
        if recalled is not None and recalled[0] == caller.tenant:
            return True
        owner = await self._lookup(session, None)
        return owner is not None and owner.tenant == caller.tenant

    async def _owner(self, session: str, ours: Owner) -> Owner:
        owner = await self._lookup(session, ours)
        assert owner is not None  # adopted when none was recorded
        return owner

    async def _lookup(self, session: str, adopt: Owner | None) -> Owner | None:
        """The session's recorded owner; with ``adopt``, that owner is recorded when none
        was (the first writer's)."""
        if self._owners is None:  # create_app refuses tenants without owners
            raise BrokerUnavailableError("no session owner records configured")
        try:
            owner = await self._owners.retained(session)
            if owner is None and adopt is not None:
                owner = await self._owners.adopt(session, adopt)
        except BrokerError as exc:
            raise BrokerUnavailableError(
                "the session owner lookup failed", detail=str(exc)
            ) from exc
        return owner

    def _recalled(self, session: str) -> tuple[str | None] | None:
        entry = self._known.get(session)
        if entry is None or self._monotonic() - entry[1] > self._fresh_s:
            return None
        return (entry[0],)

    def _remember(self, session: str, tenant: str | None) -> None:
        self._known[session] = (tenant, self._monotonic())
        self._known.move_to_end(session)
        if len(self._known) > self._remembered:
            self._known.popitem(last=False)
