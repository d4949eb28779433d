"""The provider gateway: OpenAI- and Anthropic-compatible HTTP in front of LLM providers, every
streamed chunk published, in order and deduplicated, to the broker.

- :func:`create_app` builds the ASGI app from :class:`GatewaySettings` and :class:`GatewayDeps`
  (the seams: :class:`Upstream`, and the broker's ``ChunkSink`` and ``StepAllocator``);
- :func:`run` serves it for real (``tokenwire gateway``), :func:`main` blocks running it on
  uvloop; :class:`GatewayServer` serves it on a socket inside a running event loop;
- :class:`CannedUpstream` answers provider calls for unit tests (the broker's twins,
  ``broker.MemoryPublisher``, ``broker.MemoryStepRegistry`` and
  ``broker.MemorySessionOwners``, live beside the real ones);
- :class:`Caller` is who made a request (``request.state.caller`` on every authenticated
  route): :func:`may_read` and :func:`visible_tenant` scope what it reads (the keys file:
  :func:`parse_keys`, :func:`key_digest`).

The rooms, each a private package, top to bottom; a room imports only the rooms below it
(tests/test_architecture.py), and every room may import ``_errors.py``, the exception tree::

    _api       the HTTP surface: the app and its routes, the server, the socket's bounds,
               the settings
    _steps     one step, live: StepRun, what it runs on (GatewayDeps), its bounds, frames
    _resume    a claimed step read back from the broker for a caller that asks again
    _access    who calls (keys), the session and step it names (identity), whose it is
               (owners); per-key limits and budgets land here
    _observe   metrics, the model call's span and GenAI figures
    _output    what the caller receives: the outbox, the streamed response, scrubbed bytes
    _routing   towards the provider: model -> Route, the provider's request, the Upstream
               seam; configured routes (groups, fallbacks, cooldowns) land here
    _dialects  each wire dialect, the neutral request, the translation table, validation

The request path: one model call, in order (``_dialects/X`` is the caller's dialect,
``_dialects/Y`` the provider's when it differs)::

    _api/server, _api/edge    the socket, bounded HTTP parsing (uvicorn)
    _api/app, _access/keys    the route -> the caller's CallerCodec; key (the Caller), body size
    _dialects/validate, X     the body is a JSON object, validated into the dialect's request
    _access/identity          the tokenwire identity headers
    _routing/routing          provider/model -> Route (providers' ProviderSpec: URL, quirks)
    _routing/provider_call    forwarded (same dialect) or translated (_routing/forward: the
                              caller headers the provider may see; _dialects/translation:
                              each field's fate; X -> neutral -> Y)
    _access/owners            a named session is the caller's tenant's (else 404)
    _access/identity          the step claimed (explicit) or its claim sent (assigned); a
                              claimed step asked for again is resumed instead (_resume)
    _observe/trace, genai     the call's span and figures
    _output/caller            the caller's output: forwarded, encoded or folded; scrubbed
    _steps/step               StepRun.start: the provider called (_routing/upstream), each
                              chunk bounded (bounds, watchdog, fit), framed (framing) and
                              published (broker ChunkSink), the caller's bytes into its outbox
    _output/caller            StepRun.response: the outbox streamed to the caller (StepStream)

Control goes back to ``_api/app`` only to return the response. Endpoints, routing, headers,
dialects, errors and publishing semantics: docs/gateway.md; the layout: docs/architecture.md.
"""

from __future__ import annotations

from tokenwire.services.gateway._access.identity import StepIdentity
from tokenwire.services.gateway._access.keys import (
    ANONYMOUS,
    Caller,
    key_digest,
    may_read,
    parse_keys,
    visible_tenant,
)
from tokenwire.services.gateway._api.app import Gateway, GatewayApp, create_app
from tokenwire.services.gateway._api.server import (
    BrokerDeps,
    GatewayServer,
    broker_deps,
    check_bind,
    main,
    run,
    tune_gc,
)
from tokenwire.services.gateway._api.settings import GatewaySettings
from tokenwire.services.gateway._errors import (
    AuthenticationError,
    BodyTooLargeError,
    BrokerUnavailableError,
    GatewayError,
    InvalidRequestError,
    RequestError,
    SessionNotFoundError,
    StepConflictError,
    StepFailureError,
    TranslationUnsupportedError,
    UnknownModelError,
    UpstreamError,
)
from tokenwire.services.gateway._resume.step_source import (
    BrokerStepSource,
    MemoryStepSource,
    StepSource,
)
from tokenwire.services.gateway._routing.canned import CannedUpstream
from tokenwire.services.gateway._routing.routing import Route, resolve, split_model
from tokenwire.services.gateway._routing.upstream import HttpUpstream, Upstream
from tokenwire.services.gateway._steps.deps import GatewayDeps
from tokenwire.services.gateway._steps.framing import FramePolicy

__all__ = [
    "ANONYMOUS",
    "AuthenticationError",
    "BodyTooLargeError",
    "BrokerDeps",
    "BrokerStepSource",
    "BrokerUnavailableError",
    "Caller",
    "CannedUpstream",
    "FramePolicy",
    "Gateway",
    "GatewayApp",
    "GatewayDeps",
    "GatewayError",
    "GatewayServer",
    "GatewaySettings",
    "HttpUpstream",
    "InvalidRequestError",
    "MemoryStepSource",
    "RequestError",
    "Route",
    "SessionNotFoundError",
    "StepConflictError",
    "StepFailureError",
    "StepIdentity",
    "StepSource",
    "TranslationUnsupportedError",
    "UnknownModelError",
    "Upstream",
    "UpstreamError",
    "broker_deps",
    "check_bind",
    "create_app",
    "key_digest",
    "main",
    "may_read",
    "parse_keys",
    "resolve",
    "run",
    "split_model",
    "tune_gc",
    "visible_tenant",
]
