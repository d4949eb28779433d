"""What a step's chunks travel in: a frame's head (frames on, ``framing.py`` fills the rest)
or a whole v1 envelope per chunk (frames off). The step's fields (session, turn, step, route)
are on every one; what only the first chunk carries (the request's time, the caller's key
name and tenant, the parent step, the routed deployment) is on ordinal 0 alone (ADR 0024)."""

from __future__ import annotations

import msgspec

from tokenwire.broker import ChunkSink, header_size, msg_id
from tokenwire.schemas import ChunkEnvelope, Routed, StreamChunk, frame_head, json_encoder
from tokenwire.services.gateway._access.identity import StepIdentity
from tokenwire.services.gateway._routing.routing import Route
from tokenwire.services.gateway._steps.framing import Head
from tokenwire.services.gateway._steps.step_plan import StepPlan


def routed(plan: StepPlan) -> Routed | msgspec.UnsetType:
    """What the step's first chunk says of its route (unset for ``provider/model``)."""
    return msgspec.UNSET if plan.routing is None else plan.routing.routed()


def _or_unset(value: str | None) -> str | msgspec.UnsetType:
    """A caller's name or tenant as an envelope field: left off the wire when None."""
    return msgspec.UNSET if value is None else value


def frame_heads(plan: StepPlan, route: Route, ident: StepIdentity, sink: ChunkSink) -> Head:
    """The step's :data:`Head`: a frame's head opening at an ordinal, and the payload bytes the
    broker takes beside its headers (read from ``sink`` at each frame: a reconnect may change
    it)."""

    def head(ordinal: int, time_ns: int) -> tuple[bytes, int]:
        first = ordinal == 0
        headers = {**plan.trace_headers} if first else {}
        headers["Nats-Msg-Id"] = msg_id(ident.session, ident.turn, ident.step, ordinal)
        owner = plan.caller if first else None
        body = frame_head(
            session=ident.session,
            turn=ident.turn,
            step=ident.step,
            ordinal=ordinal,
            time_ns=time_ns,
            provider=route.provider,
            model=route.model,
            request_time_ns=plan.request_time_ns if first else None,
            key_name=_or_unset(owner.name if owner else None),
            tenant=_or_unset(owner.tenant if owner else None),
            parent=plan.parent(ident) if first else msgspec.UNSET,
            routed=routed(plan) if first else msgspec.UNSET,
        )
        return body, sink.max_payload - header_size(headers)

    return head


def envelope(
    plan: StepPlan,
    route: Route,
    ident: StepIdentity,
    chunk: StreamChunk,
    *,
    ordinal: int,
    time_ns: int,
) -> bytes:
    """One chunk's v1 envelope (frames off)."""
    if ordinal == 0:
        caller = plan.caller
        first = ChunkEnvelope(
            session=ident.session,
            turn=ident.turn,
            step=ident.step,
            ordinal=0,
            time_ns=time_ns,
            provider=route.provider,
            model=route.model,
            chunk=chunk,
            request_time_ns=plan.request_time_ns,
            key_name=_or_unset(caller.name),
            tenant=_or_unset(caller.tenant),
            parent=plan.parent(ident),
            routed=routed(plan),
        )
        return json_encoder.encode(first)
    later = ChunkEnvelope(
        session=ident.session,
        turn=ident.turn,
        step=ident.step,
        ordinal=ordinal,
        time_ns=time_ns,
        provider=route.provider,
        model=route.model,
        chunk=chunk,
    )
    return json_encoder.encode(later)
