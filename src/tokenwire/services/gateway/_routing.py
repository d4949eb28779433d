"""Model routing: ``provider/model`` to where the request goes and how its stream is read.

The provider table is :func:`tokenwire.providers.get_provider`. ``scripted`` is the offline
scripted provider at ``TOKENWIRE_SCRIPTED_BASE_URL``: it speaks the caller's own dialect, so
both endpoints reach it without translation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from tokenwire.providers import (
    Normaliser,
    OpenAIChatNormaliser,
    ProviderConfigError,
    UnknownProviderError,
    get_provider,
)
from tokenwire.services.gateway._errors import UnknownModelError

CallerDialect = Literal["openai-chat", "anthropic-messages", "openai-responses"]
"""The dialects the gateway's endpoints speak."""

SCRIPTED = "scripted"
_SCRIPTED_PATHS: dict[CallerDialect, str] = {
    "openai-chat": "/v1/chat/completions",
    "anthropic-messages": "/v1/messages",
    "openai-responses": "/v1/chat/completions",  # it has no Responses API: Chat, translated
}
# Anthropic's API refuses requests without a version header; the SDK's current value.
_ANTHROPIC_HEADERS = {"anthropic-version": "2023-06-01"}


@dataclass(frozen=True)
class Route:
    """Where one request goes. ``headers`` hold the credential: never log or echo them."""

    provider: str
    model: str
    dialect: str
    url: str
    normaliser: Callable[[], Normaliser]
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def legacy_max_tokens(self) -> bool:
        """OpenAI-compatible servers other than OpenAI read ``max_tokens``."""
        return self.provider != "openai"


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
        url = spec.stream_url(env).replace("{model}", model)
    except UnknownProviderError as exc:
        raise UnknownModelError(f"unknown provider {provider!r}", model=value) from exc
    except ProviderConfigError as exc:
        message = f"provider {provider!r} is not configured: {exc}"
        raise UnknownModelError(message, model=value) from exc
    headers = dict(spec.auth_headers(spec.api_key(env)))
    if spec.dialect == "anthropic-messages":
        headers |= _ANTHROPIC_HEADERS
    return Route(provider, model, spec.dialect, url, spec.normaliser, headers)


def _scripted(model: str, caller: CallerDialect, env: Mapping[str, str]) -> Route:
    base = env.get("TOKENWIRE_SCRIPTED_BASE_URL", "").rstrip("/").removesuffix("/v1")
    if not base:
        raise UnknownModelError(
            "provider 'scripted' is not configured (TOKENWIRE_SCRIPTED_BASE_URL)",
            model=f"{SCRIPTED}/{model}",
        )
    url = base + _SCRIPTED_PATHS[caller]
    dialect = "openai-chat" if caller == "openai-responses" else caller
    return Route(SCRIPTED, model, dialect, url, _scripted_normaliser(caller, model))


def _scripted_normaliser(caller: CallerDialect, model: str) -> Callable[[], Normaliser]:
    """The scripted provider speaks the caller's dialect: read it with that dialect's reader."""
    if caller != "anthropic-messages":
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
