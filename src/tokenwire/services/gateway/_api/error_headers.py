"""The headers of an error answer: how and when a client may try again (``retry-after``,
``x-should-retry``, OpenAI's ``x-ratelimit-*``), the provider's relayed ones, the challenge."""

from __future__ import annotations

from tokenwire.services.gateway._access.identity import StepIdentity
from tokenwire.services.gateway._errors import (
    AuthenticationError,
    BudgetExceededError,
    GatewayError,
    RateLimitedError,
    RouteUnavailableError,
    TooManyResumersError,
    UpstreamError,
)
from tokenwire.services.gateway._resume.resume import RESUME_RETRY_AFTER_S

NOT_RETRYABLE = frozenset({400, 401, 404, 409, 410, 413, 422})
"""Answers a retry of the same request cannot change."""


def error_headers(exc: GatewayError, identity: StepIdentity | None) -> dict[str, str]:
    """What an answer of ``exc`` carries beside its body (the step's identity, when known)."""
    headers = identity.headers() if identity is not None else {}
    if isinstance(exc, AuthenticationError):
        headers["www-authenticate"] = "Bearer"
    if isinstance(exc, UpstreamError):
        headers.update(exc.relay_headers)
    if isinstance(exc, RateLimitedError):
        headers.update(exc.headers)
        headers["retry-after"] = str(exc.retry_after_s)  # the minute's end, or a second
    elif isinstance(exc, BudgetExceededError):
        headers["retry-after"] = str(exc.retry_after_s)  # the period's end
        headers["x-should-retry"] = "false"  # an SDK's retries would all be refused
    elif isinstance(exc, TooManyResumersError):
        headers["retry-after"] = str(RESUME_RETRY_AFTER_S)  # room comes as others end
    elif isinstance(exc, RouteUnavailableError):
        headers["retry-after"] = str(exc.retry_after_s)  # the soonest deployment back
    elif exc.status in NOT_RETRYABLE or (identity is not None and identity.explicit):
        # the SDKs retry 409 (and more) by default; the same explicit triple, claimed,
        # answers what it answered (resumed) whatever failed, so its caller is told the
        # real failure instead of retrying into it
        headers["x-should-retry"] = "false"
    return headers
