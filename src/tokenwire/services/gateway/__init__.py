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
  :func:`parse_keys`, :func:`key_digest`; ``_keys.py``).

The request path: the modules one model call passes through, in order (``_dialects/X`` is the
caller's dialect module, ``_dialects/Y`` the provider's when it differs)::

    _run, _edge          the socket, bounded HTTP parsing (uvicorn)
    _app, _keys          the route -> the caller's CallerCodec; key (the Caller), body size
    _validate            the body is a JSON object
    _dialects/X          validated into the dialect's request
    _identity            the tokenwire identity headers
    _routing             provider/model -> Route (providers' ProviderSpec: URL, quirks)
    _provider_call       forwarded (same dialect) or translated:
      _forward             the caller headers the provider may see
      _dialects/translation  each field's fate for the pair
      _dialects/X -> neutral -> _dialects/Y   the neutral request, the provider's body
    _owners              a named session is the caller's tenant's (else 404)
    _identity            the step claimed (explicit) or its claim sent (assigned); a claimed
                         step asked for again by the same request is resumed instead:
      _resume, _step_source  its chunks read back from the broker, rendered by _dialects/X
    _trace, _genai       the call's span and figures
    _caller              the caller's output: forwarded (X's Forwarder) or encoded (X's
                         StreamEncoder), or folded for a non-streaming caller; _scrubbed
    _step                StepRun.start: the provider called (_deps Upstream), each chunk
                         bounded (_bounds, _watchdog, _fit), framed (_framing) and published
                         (broker ChunkSink),
                         the caller's bytes into its outbox; the rest in its own task
    _caller              StepRun.response: the outbox streamed to the caller (StepStream);
                         the caller leaving goes back to StepRun.caller_left

Control goes back to ``_app`` only to return the response. Endpoints, routing, headers,
dialects, errors and publishing semantics: docs/gateway.md; the layout: docs/adr/0019.
"""

from __future__ import annotations

from tokenwire.services.gateway._app import Gateway, GatewayApp, create_app
from tokenwire.services.gateway._canned import CannedUpstream
from tokenwire.services.gateway._deps import GatewayDeps, HttpUpstream, Upstream
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
from tokenwire.services.gateway._framing import FramePolicy
from tokenwire.services.gateway._identity import StepIdentity
from tokenwire.services.gateway._keys import (
    ANONYMOUS,
    Caller,
    key_digest,
    may_read,
    parse_keys,
    visible_tenant,
)
from tokenwire.services.gateway._routing import Route, resolve, split_model
from tokenwire.services.gateway._run import (
    BrokerDeps,
    GatewayServer,
    broker_deps,
    check_bind,
    main,
    run,
    tune_gc,
)
from tokenwire.services.gateway._settings import GatewaySettings
from tokenwire.services.gateway._step_source import BrokerStepSource, MemoryStepSource, StepSource

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
