"""The providers package's exception tree and the retryable classification of provider errors.

Exception tree::

    ProviderError
    ├── UnknownProviderError   a provider name not in the registry
    ├── ProviderConfigError    a provider's required setting (e.g. its base URL) is missing
    └── ProviderHTTPError      the provider answered with a non-2xx status

Mid-stream failures are not exceptions: a normaliser ends the step with ``finish {error}``
(:class:`tokenwire.schemas.StepError`), classified by :func:`is_retryable`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

# Codes that no retry can fix, even when they arrive with a 429 (OpenAI's insufficient_quota).
_PERMANENT_CODES: Final = frozenset(
    {
        "insufficient_quota",
        "invalid_request_error",
        "invalid_request",
        "tool_use_failed",
        "context_length_exceeded",
        "invalid_api_key",
        "authentication_error",
        "permission_error",
        "permission_denied",
        "not_found_error",
        "model_not_found",
        "billing_hard_limit_reached",
        "content_policy_violation",
    }
)
# Substrings of codes/types that mean "try again later".
_TRANSIENT_MARKERS: Final = (
    "rate_limit",
    "overloaded",
    "server_error",
    "timeout",
    "unavailable",
    "internal",
    "api_error",
    "capacity",
)


def is_retryable(status: int | None = None, code: str | None = None) -> bool:
    """Whether sending the same request again may succeed.

    A known permanent ``code`` wins; then a transient-sounding code; then the HTTP ``status``
    (408, 409, 425, 429 and 5xx are retryable). Nothing known: not retryable.
    """
    lowered = (code or "").lower()
    if lowered in _PERMANENT_CODES:
        return False
    if any(marker in lowered for marker in _TRANSIENT_MARKERS):
        return True
    if status is None:
        return False
    return status in (408, 409, 425, 429) or status >= 500


class ProviderError(Exception):
    """Base of every error raised by ``tokenwire.providers``."""


class UnknownProviderError(ProviderError, LookupError):
    """``name`` is not a provider of the registry; ``known`` lists the names that are."""

    def __init__(self, name: str, known: tuple[str, ...]) -> None:
        super().__init__(f"unknown provider {name!r} (known: {', '.join(known)})")
        self.name = name
        self.known = known


class ProviderConfigError(ProviderError):
    """The setting ``variable`` is required for this provider and is not set."""

    def __init__(self, variable: str, reason: str) -> None:
        super().__init__(f"{reason}: set {variable}")
        self.variable = variable
        self.reason = reason


class ProviderHTTPError(ProviderError):
    """The provider answered ``status`` before any stream; ``message`` is its error text.

    The message comes from the provider's error body (never from our request), so it holds no
    credential. ``code`` is the provider's error code or type when the body had one.
    """

    def __init__(
        self,
        status: int,
        message: str,
        retryable: bool,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"provider returned HTTP {status}: {message}")
        self.status = status
        self.message = message
        self.retryable = retryable
        self.code = code
        self.headers: dict[str, str] = relayed_headers(headers or {})


RELAYED_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")
RELAYED_NAMES = frozenset({"retry-after", "retry-after-ms"})


def relayed_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The headers of a provider's error answer its caller's SDK acts on: ``retry-after``,
    ``retry-after-ms`` and the rate-limit headers (OpenAI's ``x-ratelimit-*``, Anthropic's
    ``anthropic-ratelimit-*``); nothing else (no cookies, no request ids of our account)."""
    out: dict[str, str] = {}
    for name, value in headers.items():
        low = name.lower()
        if low in RELAYED_NAMES or low.startswith(RELAYED_PREFIXES):
            out[low] = value
    return out
