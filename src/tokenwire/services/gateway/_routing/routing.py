"""Model routing: ``provider/model`` to where the request goes and how its stream is read.

The provider table is :func:`tokenwire.providers.get_provider`. ``scripted`` is the offline
scripted provider at ``TOKENWIRE_SCRIPTED_BASE_URL``: it speaks the caller's own dialect, so
both endpoints reach it without translation. A routes file's deployment becomes a Route the
same way (:func:`deployment_route`), with its own base URL and credential.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import assert_never

from tokenwire.providers import (
    Dialect,
    Normaliser,
    OpenAIChatNormaliser,
    ProviderConfigError,
    UnknownProviderError,
    get_provider,
)
from tokenwire.services.gateway._dialects.base import CallerDialect
from tokenwire.services.gateway._errors import UnknownModelError
from tokenwire.services.gateway._routing.routes_file import SCRIPTED, DeploymentSpec


@dataclass(frozen=True, kw_only=True)
class Route:
    """Where one request goes. ``headers`` hold the credential: never log or echo them."""

    provider: str
    model: str
    dialect: Dialect
    url: str
    normaliser: Callable[[], Normaliser]
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    caller_headers: tuple[str, ...] = ()
    """The caller's headers (lower case) passed on to the provider (its spec's)."""
    legacy_max_tokens: bool = True
    """An OpenAI-compatible server other than OpenAI: it reads ``max_tokens``."""


def split_model(value: str) -> tuple[str, str]:
    """``provider/model`` split at the first slash (model names may hold more slashes)."""
    provider, sep, model = value.partition("/")
    if not sep or not provider or not model:
        raise UnknownModelError(
            f"model must be 'provider/model' (e.g. 'openai/gpt-4o'), got {value!r}", model=value
        )
    return provider, model


def resolve(value: str, caller: CallerDialect, env: Mapping[str, str]) -> Route:
    """The route for ``model`` on an endpoint of dialect ``caller``; 404 for an unknown one."""
    provider, model = split_model(value)
    if provider == SCRIPTED:
        return _scripted(model, caller, env)
    try:
        spec = get_provider(provider)
        # the model is one path segment (Gemini's): "#", "?" or "/" in it must not re-aim the
        # gateway's credential at another path of the provider
        url = spec.stream_url(env).replace("{model}", urllib.parse.quote(model, safe=""))
    except UnknownProviderError as exc:
        raise UnknownModelError(f"unknown provider {provider!r}", model=value) from exc
    except ProviderConfigError as exc:
        message = f"provider {provider!r} is not configured: {exc}"
        raise UnknownModelError(message, model=value) from exc
    headers = dict(spec.auth_headers(spec.api_key(env))) | dict(spec.headers)
    return Route(
        provider=provider,
        model=model,
        dialect=spec.dialect,
        url=url,
        normaliser=spec.normaliser,
        headers=headers,
        caller_headers=spec.caller_headers,
        legacy_max_tokens=spec.legacy_max_tokens,
    )


def deployment_route(d: DeploymentSpec, caller: CallerDialect) -> Route:
    """The Route of a routes file's deployment for a caller of dialect ``caller`` (the
    scripted provider's follows it; every other provider's is its own)."""
    if d.provider == SCRIPTED:
        assert d.base_url is not None  # the routes file requires it
        return _scripted_at(d.base_url, d.model, caller)
    spec = get_provider(d.provider)
    base = (d.base_url or spec.default_base_url).rstrip("/")
    url = (base + spec.stream_path).replace("{model}", urllib.parse.quote(d.model, safe=""))
    headers = dict(spec.auth_headers(d.api_key)) | dict(spec.headers)
    return Route(
        provider=d.provider,
        model=d.model,
        dialect=spec.dialect,
        url=url,
        normaliser=spec.normaliser,
        headers=headers,
        caller_headers=spec.caller_headers,
        legacy_max_tokens=spec.legacy_max_tokens,
    )


def _scripted(model: str, caller: CallerDialect, env: Mapping[str, str]) -> Route:
    base = env.get("TOKENWIRE_SCRIPTED_BASE_URL", "")
    if not base:
        raise UnknownModelError(
            "provider 'scripted' is not configured (TOKENWIRE_SCRIPTED_BASE_URL)",
            model=f"{SCRIPTED}/{model}",
        )
    return _scripted_at(base, model, caller)


def _scripted_at(base_url: str, model: str, caller: CallerDialect) -> Route:
    base = base_url.rstrip("/").removesuffix("/v1")
    dialect, path = _scripted_dialect(caller)
    every = _SCRIPTED_CALLER_HEADERS
    normaliser = _scripted_normaliser(dialect, model)
    return Route(
        provider=SCRIPTED,
        model=model,
        dialect=dialect,
        url=base + path,
        normaliser=normaliser,
        caller_headers=every,
    )


_SCRIPTED_CALLER_HEADERS = (
    "anthropic-beta",
    "openai-beta",
    "openai-organization",
    "openai-project",
)
"""The scripted provider receives every header a real provider would (tests read them)."""


def _scripted_dialect(caller: CallerDialect) -> tuple[Dialect, str]:
    """The scripted provider speaks the caller's dialect, at that dialect's path; it has no
    Responses API: a Responses caller reaches its Chat endpoint, translated."""
    match caller:
        case Dialect.OPENAI_CHAT | Dialect.OPENAI_RESPONSES:
            return Dialect.OPENAI_CHAT, "/v1/chat/completions"
        case Dialect.ANTHROPIC_MESSAGES:
            return Dialect.ANTHROPIC_MESSAGES, "/v1/messages"
        case _:
            assert_never(caller)


def _scripted_normaliser(dialect: Dialect, model: str) -> Callable[[], Normaliser]:
    """The scripted provider's stream, read with its dialect's reader."""
    if dialect != Dialect.ANTHROPIC_MESSAGES:
        return OpenAIChatNormaliser
    try:
        return get_provider("anthropic").normaliser
    except UnknownProviderError as exc:
        raise UnknownModelError("no Anthropic reader registered", model=model) from exc


def with_identity(route: Route, identity_headers: Mapping[str, str]) -> Route:
    """The route with the step's identity headers for the scripted provider, which seeds its
    content with the session; real providers never receive tokenwire's identity."""
    if route.provider != SCRIPTED:
        return route
    return replace(route, headers={**route.headers, **identity_headers})
