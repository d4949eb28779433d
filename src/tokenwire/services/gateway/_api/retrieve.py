"""``GET /v1/responses/{id}``: the Responses API's own resume, served from the broker.

As the official SDK calls it (``client.responses.retrieve(id)`` and
``client.responses.retrieve(id, stream=True, starting_after=N)``): the answer of the step
that made the response ``id``, folded (``stream`` absent or false: once the step ended), or
its stream rendered again by the gateway's Responses encoder from ordinal 0 and from the
event after ``starting_after`` on, then live until the step ends. Every Responses answer is
resumable: its id is made from its step (``resp_tw-<turn>-<step>-<session>``) or, when the
caller saw a provider's id (a forwarded OpenAI Responses stream), mapped to the step in the
registry before the caller's first byte. No provider is ever called. Unknown ids: 404; the
step gone from the broker: 410. With tenant keys, another tenant's response answers exactly
as an unknown id (the gateway's ``SessionGuard.may_read``, as the session routes), after the
same reads.
"""

from __future__ import annotations

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
_MAX_AFTER_DIGITS = 18
"""A ``starting_after`` of more digits is no event's ``sequence_number`` (a 400, not int()'s
ValueError past 4,300 digits)."""
_NO_SESSION = "tw-no-response-"
"""The prefix of the session an unknown id's reads are made for (no step has it: the
gateway's own session ids are uuids, and a caller's own are what it names)."""


class NoSuchResponseError(UnknownModelError):
    """``GET /v1/responses/{id}`` for an id no step made (404)."""

    def __init__(self, response_id: str) -> None:
        super().__init__(f"no response {response_id!r} is retained", model=response_id)
        self.param = "response_id"


async def retrieve_target(
    steps: StepAllocator, response_id: str
) -> tuple[ResumeTarget | None, str]:
    """The step that made ``response_id`` with its claim's record (None when no step did),
    and the session whose owner decides who may read it.

    The same reads either way, whether a step made the id or not: the id's mapping, then a
    claim's record (the step's, or for an id no step made, that of a session no step has),
    and the caller then asks for that session's owner. So another tenant's response and an
    unknown id are told apart neither by the answer nor by its time (an unknown
    provider-style id used to be read five times, 0.1 s apart, for a mapping written late)."""
    try:
        triple = await _triple(steps, response_id)
        probe = triple or (_NO_SESSION + response_alias(response_id)[:32], 0, 0)
        record = await steps.record(*probe)
    except BrokerError as exc:
        raise BrokerUnavailableError("the step registry is unavailable", detail=str(exc)) from exc
    if triple is None or record is None:
        return None, probe[0]
    return ResumeTarget(StepIdentity(*triple, explicit=True), record), triple[0]


async def _triple(steps: StepAllocator, response_id: str) -> tuple[str, int, int] | None:
    """The step an id names: mapped (an id the caller saw from the provider, mapped before
    the caller saw it), else made from the step (``resp_tw-<turn>-<step>-<session>``)."""
    bound = await steps.key_binding(response_alias(response_id), float("inf"))
    if bound is not None:
        return bound.session, bound.turn, bound.step
    if (derived := _DERIVED.fullmatch(response_id)) is not None:
        return derived.group(3), int(derived.group(1)), int(derived.group(2))
    return None


def retrieve_request(request: Request) -> tuple[ResponsesRequest, int | None]:
    """The query's ``stream`` and ``starting_after`` (400 when malformed)."""
    query = request.query_params
    stream = query.get("stream", "false").lower()
    if stream not in ("true", "false"):
        raise InvalidRequestError("stream must be true or false", param="stream")
    after = query.get("starting_after")
    if after is not None and not (after.isdigit() and len(after) <= _MAX_AFTER_DIGITS):
        raise InvalidRequestError(
            "starting_after must be an integer from 0 (a sequence_number)", param="starting_after"
        )
    if after is not None and stream != "true":
        raise InvalidRequestError(
            "starting_after applies to a streamed retrieval only (stream=true)",
            param="starting_after",
        )
    req = ResponsesRequest(model="", input="", stream=stream == "true")
    return req, int(after) if after is not None else None
