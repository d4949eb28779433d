"""A step's plan (:class:`StepPlan`): everything a step needs, decided once its request passed
every check (the app makes it, ``step.py`` runs it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from tokenwire.broker import StepNames
from tokenwire.schemas import Routed, StepLink, TokenUsage
from tokenwire.services.gateway._access.identity import StepClaim, StepIdentity
from tokenwire.services.gateway._access.keys import ANONYMOUS, Caller
from tokenwire.services.gateway._access.threads import StepThread
from tokenwire.services.gateway._output.caller import HeadTap
from tokenwire.services.gateway._routing.routing import Route
from tokenwire.services.gateway._routing.upstream import UpstreamCall
from tokenwire.services.gateway._steps.fallback import RoutedStep


@dataclass(frozen=True, kw_only=True)
class StepPlan:
    """Everything a step needs, decided once its request passed every check.

    ``claim`` gives the step's identity: known for an explicit triple, sent to the registry
    beside the provider call for an assigned one (the step waits for it before it publishes).
    ``call`` is the provider call, already sent (the provider works while the step is set
    up); the step reads it, or cancels it when it ends without reading.
    """

    session: str
    claim: StepClaim
    route: Route
    call: UpstreamCall
    request_time_ns: int
    trace_headers: dict[str, str]
    secrets: tuple[str, ...] = ()
    continue_on_disconnect: bool = True
    """Whether the step reads the provider to the end when its caller leaves."""
    caller: Caller = ANONYMOUS
    """Whose step it is: its key's name and tenant go on the first chunk (``_access/keys.py``)."""
    naming: Callable[[HeadTap | None, bool], StepNames] | None = None
    """A resumable step's names (``_resume/resume.py``): how its caller saw the answer named, from
    the provider's first events (read by a :class:`HeadTap`) or the gateway's reply, as
    forwarded or not; kept with the claim once the first chunk is published. None: not
    resumable, nothing kept."""
    forwarded: bool = False
    """The provider speaks the caller's dialect: its events are forwarded."""
    routing: RoutedStep | None = None
    """A routed step's attempts (``_steps/fallback.py``): a call that fails before the first
    byte is followed by the next deployment's. None: ``provider/model``, one call."""
    aliased: bool = False
    """A Responses answer: its id is mapped to the step too (``GET /v1/responses/{id}``)."""
    names_before_bytes: bool = False
    """The caller's first bytes carry the provider's id (a forwarded Responses stream): they
    wait until the names and the id's mapping are kept, so that a retrieve right after them
    finds the step (the one wait of one broker round trip it costs that stream)."""
    coalesce_s: float = 0.0
    """The wait before each provider read past the first (``_steps/coalesce.py``); 0: none."""
    on_end: Callable[[TokenUsage | None, Route, Routed | None, bool], None] | None = None
    """Told once when the step ended, however: the usage the provider reported, the route that
    served it, its routing record, whether any chunk was taken (the call's admission settles
    by it: ``_limits/limiter.py``)."""
    thread: StepThread | None = None
    """The step's place in its session's graph (its parent goes on its first chunk) and the
    keys its answer marks (``_access/threads.py``); None: neither."""

    def parent(self, identity: StepIdentity) -> StepLink | msgspec.UnsetType:
        """The first chunk's ``parent``: unset when the step has none."""
        parent = self.thread.parent(identity) if self.thread is not None else None
        return msgspec.UNSET if parent is None else parent
