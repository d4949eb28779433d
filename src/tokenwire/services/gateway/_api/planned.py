"""A model call that passed its checks (:class:`CheckedCall`), how its answer is named
(:func:`reply_for`, :func:`naming_for`), and a routed step's attempts
(:func:`routed_step`: each fallback translated and sent as the first call was;
docs/gateway.md, "Routes")."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic

from starlette.requests import Request

from tokenwire.broker import StepNames
from tokenwire.providers import Dialect
from tokenwire.services.gateway._access.identity import SESSION_HEADER, StepClaim, StepIdentity
from tokenwire.services.gateway._access.keys import Caller
from tokenwire.services.gateway._access.threads import StepThread
from tokenwire.services.gateway._api.routed import Routing
from tokenwire.services.gateway._dialects import CallerCodec, R, Reply, provider_reply
from tokenwire.services.gateway._limits.limiter import Admission
from tokenwire.services.gateway._observe.metrics import GatewayMetrics
from tokenwire.services.gateway._output.caller import CallerOutput, HeadTap
from tokenwire.services.gateway._resume.resume import step_ref
from tokenwire.services.gateway._routing.health import HealthBook
from tokenwire.services.gateway._routing.plan import Candidate
from tokenwire.services.gateway._routing.provider_call import (
    CallerInput,
    ProviderCall,
    provider_call,
)
from tokenwire.services.gateway._routing.routing import Route, with_identity
from tokenwire.services.gateway._routing.upstream import Upstream, UpstreamCall
from tokenwire.services.gateway._steps.fallback import Attempt, RoutedStep


@dataclass(frozen=True, kw_only=True)
class CheckedCall(Generic[R]):
    """A model call that passed its checks: what its step is planned from."""

    request: Request
    codec: CallerCodec[R]
    req: R
    sent: CallerInput
    headers: Mapping[str, str]
    caller: Caller
    session: str
    received_ns: int
    coalesce: int
    thread: StepThread
    admission: Admission | None = None
    """What the call took of its key's and tenant's limits (None: it has none)."""


async def reply_for(
    r: CheckedCall[R], claim: StepClaim, new_id: Callable[[], str]
) -> tuple[Reply, StepIdentity | None]:
    """How the answer is named, and the step's identity when known now (a resumable step's
    answer is named from the step; every Responses answer can be retrieved, so its step is
    waited for)."""
    known = claim.known
    if known is None and r.codec.dialect is Dialect.OPENAI_RESPONSES:
        known = await claim.identity()
    raw_id = step_ref(known) if known is not None else new_id()
    reply = Reply(r.codec.reply_id(raw_id), r.req.model, r.received_ns // 1_000_000_000)
    return reply, known


def routed_step(
    routing: Routing | None,
    r: CheckedCall[R],
    *,
    first: tuple[Route, UpstreamCall, CallerOutput, ProviderCall],
    upstream: Upstream,
    output: Callable[[Route], CallerOutput],
    health: HealthBook,
    metrics: GatewayMetrics,
) -> RoutedStep | None:
    """A routed step's attempts (None for ``provider/model``), the ``first`` already sent
    (its Route as sent, the call, its output, the provider call it was made from);
    ``output`` makes the caller's output for a call's route (forwarded or encoded)."""
    if routing is None:
        return None
    route, call, out, planned = first
    forwarded = route.dialect == r.codec.dialect
    sent = Attempt(routing.first, route, call, out, forwarded, planned.response_headers)

    def make(candidate: Candidate) -> Attempt:
        call = provider_call(r.codec, r.req, candidate.route, r.sent)
        routed = with_identity(call.route, {SESSION_HEADER: r.session})
        sent = upstream.send(routed, call.body)
        forwarded = routed.dialect == r.codec.dialect
        return Attempt(candidate, routed, sent, output(routed), forwarded, call.response_headers)

    return RoutedStep(routing.plan, health, sent, make, metrics, skipped=routing.skipped)


def served_headers(call: ProviderCall, attempts: RoutedStep | None) -> Mapping[str, str]:
    """The answer's extra headers of the call that served the step (the fields its
    translation dropped): a routed step's last call's, which a fallback may have changed."""
    return call.response_headers if attempts is None else attempts.current.response_headers


def naming_for(reply: Reply, stream: bool) -> Callable[[HeadTap | None, bool], StepNames]:
    """How a resumable step's answer is named to its caller: a forwarded stream as the
    provider named it (id, model, time), a folded answer with the provider's model and, when
    the provider speaks the caller's dialect, its id (``provider_reply``; else the gateway's
    id, as ``_folded``), an encoded stream as the gateway's ``reply``; ``forwarded``: the call
    that served the step speaks the caller's dialect (a routed step's last one)."""

    def names(head: HeadTap | None, forwarded: bool) -> StepNames:
        if head is None or (stream and not forwarded):
            return StepNames(reply.response_id, reply.model, reply.created)
        folded = provider_reply(reply, head.response_id if forwarded else None, head.model)
        if not stream:  # the folded answer: the provider's id and model, the gateway's time
            return StepNames(folded.response_id, folded.model, reply.created)
        created = head.created if head.created is not None else reply.created
        return StepNames(folded.response_id, folded.model, created, head.system_fingerprint)

    return names
