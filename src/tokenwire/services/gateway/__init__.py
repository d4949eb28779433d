"""The provider gateway: OpenAI- and Anthropic-compatible HTTP in front of LLM providers, every
streamed chunk published, in order and deduplicated, to the broker.

- :func:`create_app` builds the ASGI app from :class:`GatewaySettings` and :class:`GatewayDeps`
  (the seams: :class:`Upstream`, :class:`ChunkSink`, :class:`StepAllocator`);
- :func:`run` serves it for real (``tokenwire gateway``), :func:`main` blocks running it on
  uvloop; :class:`GatewayServer` serves it on a socket inside a running event loop;
- the in-memory seams (:class:`MemorySink`, :class:`MemorySteps`, :class:`CannedUpstream`) serve
  unit tests.

Endpoints, routing, headers, dialects, errors and publishing semantics: docs/gateway.md.
"""

from __future__ import annotations

from tokenwire.services.gateway._app import Gateway, GatewayApp, create_app
from tokenwire.services.gateway._errors import (
    AuthenticationError,
    BodyTooLargeError,
    BrokerUnavailableError,
    GatewayError,
    InvalidRequestError,
    RequestError,
    StepConflictError,
    StepFailureError,
    TranslationUnsupportedError,
    UnknownModelError,
    UpstreamError,
)
from tokenwire.services.gateway._identity import StepAllocator, StepIdentity, StepTaken
from tokenwire.services.gateway._memory import CannedUpstream, MemorySink, MemorySteps, Published
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
from tokenwire.services.gateway._seams import ChunkSink, GatewayDeps, HttpUpstream, Upstream
from tokenwire.services.gateway._settings import GatewaySettings

__all__ = [
    "AuthenticationError",
    "BodyTooLargeError",
    "BrokerDeps",
    "BrokerUnavailableError",
    "CannedUpstream",
    "ChunkSink",
    "Gateway",
    "GatewayApp",
    "GatewayDeps",
    "GatewayError",
    "GatewayServer",
    "GatewaySettings",
    "HttpUpstream",
    "InvalidRequestError",
    "MemorySink",
    "MemorySteps",
    "Published",
    "RequestError",
    "Route",
    "StepAllocator",
    "StepConflictError",
    "StepFailureError",
    "StepIdentity",
    "StepTaken",
    "TranslationUnsupportedError",
    "UnknownModelError",
    "Upstream",
    "UpstreamError",
    "broker_deps",
    "check_bind",
    "create_app",
    "main",
    "resolve",
    "run",
    "split_model",
    "tune_gc",
]
