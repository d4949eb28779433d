"""``GET /v1/responses/{id}``: the Responses API's own resume, served from the broker.

As the official SDK calls it (``client.responses.retrieve(id)`` and
``client.responses.retrieve(id, stream=True, starting_after=N)``): the answer of the step
that made the response ``id``, folded (``stream`` absent or false: once the step ended), or
its stream rendered again by the gateway's Responses encoder from ordinal 0 and from the
event after ``starting_after`` on, then live until the step ends. Every Responses answer is
resumable: its id is made from its step (``resp_tw-<turn>-<step>-<session>``) or, when the
caller saw a provider's id, mapped to the step in the registry once its first chunk was
published. No provider is ever called. Unknown ids: 404; the step gone from the broker: 410.
With tenant keys, another tenant's response answers exactly as an unknown id (the gateway's
``SessionGuard.may_read``, as the session routes).
"""

from __future__ import annotations

import asyncio
import re

from starlette.requests import Request

from tokenwire.broker import BrokerError, StepAllocator
from tokenwire.services.gateway._access.identity import ResumeTarget, StepIdentity
from tokenwire.services.gateway._dialects.openai_responses import ResponsesRequest
from tokenwire.services.gateway._errors import (
    BrokerUnavailableError,
    InvalidRequestError,
    UnknownModelError,
)
from tokenwire.services.gateway._resume.resume import response_alias

_DERIVED = re.compile(r"resp_tw-([0-9]{1,15})-([0-9]{1,15})-([A-Za-z0-9_-]{1,128})")
_ALIAS_READS = 5
_ALIAS_PAUSE_S = 0.1
"""A provider-named id is mapped once the step's first chunk is published: a retrieve that
races that write reads the mapping again, at most this many times this far apart."""


class NoSuchResponseError(UnknownModelError):
    """``GET /v1/responses/{id}`` for an id no step made (404)."""

    def __init__(self, response_id: str) -> None:
        super().__init__(f"no response {response_id!r} is retained", model=response_id)
        self.param = "response_id"


async def retrieve_target(steps: StepAllocator, response_id: str) -> ResumeTarget:
    """The step that made ``response_id``, with its claim's record."""
    try:
        triple = await _triple(steps, response_id)
        record = await steps.record(*triple) if triple is not None else None
    except BrokerError as exc:
        raise BrokerUnavailableError(f"the step registry is unavailable: {exc}") from exc
    if triple is None or record is None:
        raise NoSuchResponseError(response_id)
    return ResumeTarget(StepIdentity(*triple, explicit=True), record)


async def _triple(steps: StepAllocator, response_id: str) -> tuple[str, int, int] | None:
    alias = response_alias(response_id)
    for attempt in range(_ALIAS_READS):
        bound = await steps.key_binding(alias, float("inf"))
        if bound is not None:
            return bound.session, bound.turn, bound.step
        if (derived := _DERIVED.fullmatch(response_id)) is not None:
            return derived.group(3), int(derived.group(1)), int(derived.group(2))
        if attempt + 1 < _ALIAS_READS:
            await asyncio.sleep(_ALIAS_PAUSE_S)
    return None


def retrieve_request(request: Request) -> tuple[ResponsesRequest, int | None]:
    """The query's ``stream`` and ``starting_after`` (400 when malformed)."""
    query = request.query_params
    stream = query.get("stream", "false").lower()
    if stream not in ("true", "false"):
        raise InvalidRequestError("stream must be true or false", param="stream")
    after = query.get("starting_after")
    if after is not None and not after.isdigit():
        raise InvalidRequestError("starting_after must be an integer >= 0", param="starting_after")
    req = ResponsesRequest(model="", input="", stream=stream == "true")
    return req, int(after) if after is not None else None
