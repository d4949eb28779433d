"""Which failures before the first byte a routed step falls back on (docs/gateway.md,
"Routes").

A call that failed before anything reached the caller is tried on the next deployment when it
could not connect (or the connection closed before an answer), gave no first token within the
group's bound, answered 429 or 5xx, said it is overloaded (Anthropic's 529 or an
``overloaded_error`` event), or ended its stream with a retryable error before any content.
Anything else (a 400, a 401, an in-band ``invalid_request``) is the step's answer, as without
routes: another deployment would answer the same.
"""

from __future__ import annotations

import math

from tokenwire.providers import ProviderHTTPError
from tokenwire.schemas import AttemptFailure, FailedAttempt, StepError
from tokenwire.services.gateway._routing.routes_file import DeploymentSpec

_CONNECT_CODES = frozenset(
    {"connect_error", "server_disconnected", "incomplete_body", "transport_error"}
)
FIRST_BYTE_TIMEOUT = "first_byte_timeout"
"""The code of a routed call given up for want of a first token within its group's bound."""
_TIMEOUT_CODES = frozenset({"connect_timeout", "read_timeout", "timeout", FIRST_BYTE_TIMEOUT})
_MESSAGE_LIMIT = 300


def http_failure(d: DeploymentSpec, exc: ProviderHTTPError) -> FailedAttempt | None:
    """The attempt an HTTP error answer makes, None when it is not one to fall back on."""
    failure = _status_failure(exc.status, exc.code)
    if failure is None:
        return None
    return _attempt(
        d, failure, exc.message, status=exc.status, retry_after_s=retry_after_s(exc.headers)
    )


def _status_failure(status: int, code: str | None) -> AttemptFailure | None:
    if status == 529 or "overloaded" in (code or ""):
        return "overloaded"
    if status == 429:
        return "rate-limited"
    if status >= 500:
        return "server-error"
    return None


def finish_failure(d: DeploymentSpec, error: StepError) -> FailedAttempt | None:
    """The attempt a first chunk that is ``finish {error}`` makes (a transport failure before
    the first byte, or an error event at once), None when it is not one to fall back on."""
    code = (error.code or "").lower()
    failure: AttemptFailure | None
    if code in _CONNECT_CODES:
        failure = "connect"
    elif code in _TIMEOUT_CODES:
        failure = "timeout"
    elif "overloaded" in code:
        failure = "overloaded"
    elif "rate_limit" in code:
        failure = "rate-limited"
    elif error.retryable or code in ("api_error", "server_error", "service_unavailable"):
        failure = "server-error"  # e.g. the stream ended before any chunk, or a 5xx in-band
    else:
        return None
    return _attempt(d, failure, error.message)


def timeout_failure(d: DeploymentSpec, seconds: float) -> FailedAttempt:
    """No first token within the group's bound."""
    return _attempt(d, "timeout", f"no first token within {seconds:g} s")


def empty_failure(d: DeploymentSpec) -> FailedAttempt:
    """The stream ended without any chunk."""
    return _attempt(d, "server-error", "the provider stream ended without a chunk")


def untranslatable(d: DeploymentSpec, why: str) -> FailedAttempt:
    """A fallback whose dialect cannot carry the request: nothing was sent to it."""
    return _attempt(d, "untranslatable", why)


def _attempt(
    d: DeploymentSpec,
    failure: AttemptFailure,
    message: str,
    *,
    status: int | None = None,
    retry_after_s: float | None = None,
) -> FailedAttempt:
    return FailedAttempt(
        d.name,
        d.provider,
        d.model,
        failure,
        message[:_MESSAGE_LIMIT],
        status=status,
        retry_after_s=retry_after_s,
    )


def retry_after_s(headers: dict[str, str]) -> float | None:
    """The provider's ``retry-after-ms`` or ``retry-after`` (seconds; an HTTP date is not
    read), None when it sent neither or nothing usable."""
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        text = headers.get(name)
        if text is None:
            continue
        try:
            value = float(text) / scale
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:
            return value
    return None
