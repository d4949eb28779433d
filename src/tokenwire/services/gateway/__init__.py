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
  route): :func:`may_use`, :func:`may_read` and :func:`visible_tenant` scope what it calls
  and reads (the keys file: :func:`parse_keys`, :func:`key_digest`; the keys bucket:
  :func:`create_key`, :func:`change_key`, :func:`revoke_key`, :func:`set_tenant`, ...).

The rooms, private packages, top to bottom; a room imports only those below it and the
exception tree ``_errors.py``: ``_api`` (the app, its routes, the server, the settings),
``_steps`` (one live step: StepRun, GatewayDeps, bounds, frames, a routed step's fallbacks),
``_resume`` (a claimed step read back), ``_access`` (keys, session identity, owners; per-key
limits and budgets land here), ``_observe`` (metrics, spans), ``_output`` (what the caller
receives), ``_routing`` (model -> Route, the provider's request, the Upstream seam; the
routes file, a request's plan of deployments, their shared cooldowns), ``_dialects`` (each
wire dialect, translation, validation).

Endpoints, routing, headers, dialects, errors and publishing semantics: docs/gateway.md; the
rooms and the modules one model call passes through, in order: docs/architecture.md.
"""

from __future__ import annotations

from tokenwire.services.gateway._access.identity import StepIdentity
from tokenwire.services.gateway._access.key_admin import (
    KeyChanges,
    LimitChanges,
    NewKey,
    change_key,
    clear_tenant,
    create_key,
    key_view,
    listing,
    revoke_key,
    set_tenant,
)
from tokenwire.services.gateway._access.keys import (
    ANONYMOUS,
    Caller,
    expiry_ns,
    key_digest,
    may_read,
    may_use,
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
    KeyEntryExistsError,
    KeyEntryNotFoundError,
    ModelNotAllowedError,
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
    "KeyChanges",
    "KeyEntryExistsError",
    "KeyEntryNotFoundError",
    "LimitChanges",
    "MemoryStepSource",
    "ModelNotAllowedError",
    "NewKey",
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
    "change_key",
    "check_bind",
    "clear_tenant",
    "create_app",
    "create_key",
    "expiry_ns",
    "key_digest",
    "key_view",
    "listing",
    "main",
    "may_read",
    "may_use",
    "parse_keys",
    "resolve",
    "revoke_key",
    "run",
    "set_tenant",
    "split_model",
    "tune_gc",
    "visible_tenant",
]
