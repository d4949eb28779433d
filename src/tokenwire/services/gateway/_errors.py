"""The gateway's exception tree. Every leaf knows its HTTP status and its error code.

```
GatewayError                        status, code, message, param
├── RequestError                    4xx: the caller got something wrong; nothing is published
│   ├── InvalidRequestError         400: malformed JSON, wrong types, bad header values
│   ├── AuthenticationError         401: missing or wrong gateway key
│   ├── ForbiddenError              403: a keyless gateway's request not addressed to loopback,
│   │   │                           or from another site's page (``_access/browsers.py``)
│   │   └── ModelNotAllowedError    403: the caller's key may not call the request's model
│   ├── UnknownModelError           404: unknown provider or malformed `provider/model`
│   ├── SessionNotFoundError        404: the named session is another tenant's
│   ├── KeyEntryNotFoundError       404: no such key (or tenant) in the keys bucket
│   ├── KeyEntryExistsError         409: a key of that name exists, or it changed meanwhile
│   ├── StepConflictError           409: a (session, turn, step) or idempotency key already
│   │                               used by a different request
│   ├── StepGoneError               410: a resumed step's chunks are no longer retained
│   ├── BodyTooLargeError           413: body above the configured maximum
│   ├── UnsupportedMediaTypeError   415: a model route's body not declared application/json
│   ├── UnpricedModelError          400: a caller under a budget named a model without a price
│   ├── RateLimitedError            429: a key's or tenant's requests, tokens or streams limit
│   ├── BudgetExceededError         429: a key's or tenant's budget cannot cover the call
│   └── TranslationUnsupportedError 400: no translation between the two dialects (yet)
└── StepFailureError                the request was valid but the step could not complete
    ├── BrokerUnavailableError      503: the broker did not acknowledge; step not captured
    ├── StepLimitError              502: the step reached a gateway bound; recorded ``limit``
    ├── StepContractError           502: the stream broke the fold's contract; recorded ``contract``
    ├── RecordedStepError           502: a resumed step had ended as a recorded error
    ├── StepAbandonedError          502: a resumed step's gateway stopped before the step ended
    ├── TooManyResumersError        429: a step already has the most resumers allowed
    ├── RouteUnavailableError       429: every deployment of a routed name (and of its
    │                               fallbacks) is cooling down or at capacity; nothing claimed
    └── UpstreamError               502 (or the provider's 4xx/429): the provider call failed
```

Messages never contain credentials: they are built from fixed text and caller-supplied values,
never from outgoing request headers; a broker's or store's words (its address) go only to the
log, as ``detail``.
"""

from __future__ import annotations


class GatewayError(Exception):
    """Base of the gateway's errors; ``status`` is the HTTP status the caller receives,
    ``message`` what it is told and ``detail`` what only the log is told."""

    status: int = 500
    code: str = "internal_error"
    detail: str = ""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class RequestError(GatewayError):
    """The caller's request is wrong; it is refused before anything is claimed or published."""

    status = 400
    code = "invalid_request_error"


class InvalidRequestError(RequestError):
    """Malformed JSON, a wrong type or value, or a malformed tokenwire header."""


class AuthenticationError(RequestError):
    """No gateway key, or one the gateway does not accept."""

    status = 401
    code = "authentication_error"


class ForbiddenError(RequestError):
    """A gateway without keys refuses a request whose ``Host`` is not loopback (DNS
    rebinding) or whose ``Origin`` is another site's (``_access/browsers.py``)."""

    status = 403
    code = "permission_error"


class ModelNotAllowedError(ForbiddenError):
    """The key's ``models`` allowlist does not hold the request's model (ADR 0041)."""

    code = "model_not_allowed"

    def __init__(self, *, key: str | None, model: str) -> None:
        super().__init__(
            f"the gateway key {key or ''!r} may not use the model {model!r} (its allowed "
            "models are set by `tokenwire keys set --models`)",
            param="model",
        )
        self.model = model


class KeyEntryNotFoundError(RequestError):
    """The keys bucket holds no key (or tenant) of that name (``tokenwire keys``)."""

    status = 404
    code = "not_found_error"


class KeyEntryExistsError(RequestError):
    """A key of that name exists already, or an entry kept changing under a change."""

    status = 409
    code = "conflict_error"


class UnknownModelError(RequestError):
    """``model`` is not ``provider/model`` with a provider the gateway knows."""

    status = 404
    code = "not_found_error"

    def __init__(self, message: str, *, model: str) -> None:
        super().__init__(message, param="model")
        self.model = model


class SessionNotFoundError(RequestError):
    """The request names a session (``X-Tokenwire-Session``) of another tenant than its key's:
    answered as the session routes answer an unknown session, before anything is claimed,
    published or sent to a provider (``_access/owners.py``)."""

    status = 404
    code = "not_found_error"

    def __init__(self, session: str, *, param: str | None = None) -> None:
        super().__init__(
            f"session {session!r} not found for this key: name one of its own sessions, or "
            "none for a new one",
            param=param,
        )
        self.session = session


class StepConflictError(RequestError):
    """The explicit (session, turn, step) was already claimed by an earlier request."""

    status = 409
    code = "conflict_error"

    def __init__(self, session: str, turn: int, step: int, why: str = "") -> None:
        super().__init__(f"step {session}/{turn}/{step} was already used" + why)
        self.session, self.turn, self.step = session, turn, step


class StepGoneError(RequestError):
    """A retried (or retrieved) step whose chunks the broker no longer holds (past the
    stream's retention), or never held (its gateway could not publish anything)."""

    status = 410
    code = "not_found_error"


class BodyTooLargeError(RequestError):
    """The request body exceeds ``GatewaySettings.max_body_bytes``."""

    status = 413
    code = "request_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"request body larger than {limit} bytes")
        self.limit = limit


class UnsupportedMediaTypeError(RequestError):
    """A model route's body is not declared ``application/json`` (a web page can send
    ``text/plain`` to any address without asking first)."""

    status = 415
    code = "invalid_request_error"

    def __init__(self, message: str) -> None:
        super().__init__(message, param="content-type")


class UnpricedModelError(RequestError):
    """A key or tenant with a budget called a model the gateway has no price for: its cost
    could be neither reserved nor settled (docs/gateway.md, "Limits and budgets")."""

    def __init__(self, model: str, *, why: str) -> None:
        super().__init__(
            f"{model} cannot be called under a budget: {why}; give its deployment a price in "
            "the routes file, or call a priced model",
            param="model",
        )
        self.model = model


class RateLimitedError(RequestError):
    """A key's or tenant's ``kind`` limit (``rpm``, ``tpm``, ``concurrent``) is reached:
    answered with ``retry-after`` and OpenAI's ``x-ratelimit-*`` headers (``headers``),
    before anything is claimed or sent."""

    status = 429
    code = "rate_limit_error"

    def __init__(
        self, message: str, *, kind: str, scope: str, retry_after_s: int, headers: dict[str, str]
    ) -> None:
        super().__init__(message)
        self.kind, self.scope = kind, scope
        self.retry_after_s = retry_after_s
        self.headers = headers


class BudgetExceededError(RequestError):
    """A key's or tenant's budget for the period cannot cover the call's reservation (its
    worst-case cost): OpenAI's ``insufficient_quota``, not retried by the SDKs; the message
    names the budget and when it resets."""

    status = 429
    code = "insufficient_quota"

    def __init__(self, message: str, *, scope: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.scope = scope
        self.retry_after_s = retry_after_s


class TranslationUnsupportedError(RequestError):
    """The caller's dialect cannot be translated to the provider's yet."""

    def __init__(self, source: str, target: str) -> None:
        super().__init__(
            f"dialect translation from {source} to {target} not supported yet", param="model"
        )
        self.source, self.target = source, target


class StepFailureError(GatewayError):
    """A valid request whose step could not complete; the failure is recorded when possible."""

    status = 502
    code = "api_error"


class BrokerUnavailableError(StepFailureError):
    """The broker did not acknowledge: the step is not captured, so it is not answered.

    The message says what did not answer; the broker's (or store's) own words, which name
    where it lives, are the ``detail``: logged, never told to the caller."""

    status = 503
    code = "overloaded_error"

    def __init__(self, message: str, *, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


class StepLimitError(StepFailureError):
    """The step reached one of the gateway's bounds (its bytes, chunks or seconds, or a chunk
    too large for the broker); it was ended and recorded as a ``limit`` error."""


class StepContractError(StepFailureError):
    """The provider's stream, normalised, broke the chunk contract the fold enforces (e.g. a
    tool call that never got a name); the step is recorded as the fold records it, a
    ``contract`` error, and the caller gets the same error instead of a normal end."""


class UpstreamError(StepFailureError):
    """The provider answered with an error status or the transport to it failed.

    ``upstream_status`` is the provider's HTTP status (``None`` for a transport failure);
    ``status`` relays the provider's 400/404/413/422/429 and maps everything else to 502
    (503 for the provider's 503/529 overload), because a provider 401 means the gateway's
    credentials are wrong, not the caller's.
    """

    _RELAYED = frozenset({400, 404, 413, 422, 429})

    def __init__(
        self,
        message: str,
        *,
        upstream_status: int | None,
        retryable: bool,
        relay_headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.upstream_status = upstream_status
        self.retryable = retryable
        self.relay_headers = relay_headers or {}  # the provider's retry-after, rate limits
        self.status = _relay_status(upstream_status)
        self.code = "rate_limit_error" if self.status == 429 else "api_error"


def _relay_status(upstream: int | None) -> int:
    if upstream is not None and upstream in UpstreamError._RELAYED:
        return upstream
    if upstream in (503, 529):
        return 503
    return 502


class RecordedStepError(StepFailureError):
    """A resumed step that had ended as a recorded error: the caller gets that error again
    (``retryable`` as recorded), never a second provider call under the same claim."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class StepAbandonedError(StepFailureError):
    """A resumed step that stopped before its end: nothing of it came for longer than the
    step's own idle bound (its gateway died, or lost the broker). It is never called again."""


class TooManyResumersError(StepFailureError):
    """The step already has ``limit`` resumers on this gateway (answered with ``retry-after``)."""

    status = 429
    code = "rate_limit_error"

    def __init__(self, message: str, *, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


class RouteUnavailableError(StepFailureError):
    """Every deployment of the routed name ``route`` and of its fallbacks is cooling down or at
    its capacity: answered with ``retry-after`` (the soonest one is back), before anything is
    claimed or sent (docs/gateway.md, "Routes")."""

    status = 429
    code = "rate_limit_error"

    def __init__(self, route: str, *, retry_after_s: int, why: str) -> None:
        super().__init__(
            f"no deployment of {route!r} can take a request now ({why}); retry after "
            f"{retry_after_s} s"
        )
        self.route = route
        self.retry_after_s = retry_after_s
