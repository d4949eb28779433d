"""The provider table: name -> wire dialect, normaliser, default base URL, env vars, auth.

Adding a provider is one row in ``_SPECS`` below, e.g.::

    ProviderSpec("anthropic", Dialect.ANTHROPIC_MESSAGES, AnthropicNormaliser,
                 "https://api.anthropic.com", "ANTHROPIC_API_KEY", "x-api-key", "/v1/messages",
                 headers=ANTHROPIC_VERSION, caller_headers=ANTHROPIC_CALLER_HEADERS),

``name`` is the routing / ``fold --provider`` name; the base-URL variable is derived from it
(``TOKENWIRE_<NAME>_BASE_URL``, dashes as underscores). Each base URL follows its provider
SDK's convention (OpenAI's and DeepSeek's include ``/v1``, Anthropic's does not), and
``stream_path`` is appended to it. Gemini puts the model in the path: use ``{model}`` there.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from tokenwire.providers._anthropic import AnthropicNormaliser
from tokenwire.providers._base import Normaliser
from tokenwire.providers._errors import ProviderConfigError, UnknownProviderError
from tokenwire.providers._gemini import GeminiNormaliser
from tokenwire.providers._openai_chat import OpenAIChatNormaliser
from tokenwire.providers._openai_responses import OpenAIResponsesNormaliser


class Dialect(enum.StrEnum):
    """The wire formats tokenwire speaks; several providers share ``openai-chat``.

    The one dialect type of the code base: a provider's (:attr:`ProviderSpec.dialect`), a
    route's and a gateway endpoint's (the gateway's ``CallerDialect`` is the subset its
    endpoints speak). A ``StrEnum``: each member equals its wire name (``"openai-chat"``).
    Adding a member makes the type checker list every ``match`` that must handle it (each ends
    in ``assert_never``): the gateway's dialect layer (``services/gateway/_dialects/``).
    """

    OPENAI_CHAT = "openai-chat"
    OPENAI_RESPONSES = "openai-responses"
    ANTHROPIC_MESSAGES = "anthropic-messages"
    GEMINI = "gemini"


AuthStyle = Literal["bearer", "x-api-key", "api-key", "x-goog-api-key", "none"]
"""How the credential is sent: ``Authorization: Bearer``, or the named header."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProviderSpec:
    """One provider: how to reach it, how to read its stream, and its quirks.

    The quirks: ``headers`` go on every request to it (Anthropic refuses requests without
    ``anthropic-version``); ``caller_headers`` are the caller's headers passed on to it (lower
    case: its beta and organisation headers); ``legacy_max_tokens``: an OpenAI-compatible
    server that reads ``max_tokens`` rather than OpenAI's ``max_completion_tokens``.
    """

    name: str
    dialect: Dialect
    normaliser: Callable[[], Normaliser]
    default_base_url: str
    api_key_env: str | None
    auth: AuthStyle
    stream_path: str
    headers: Mapping[str, str] = field(default_factory=dict)
    caller_headers: tuple[str, ...] = ()
    legacy_max_tokens: bool = True

    @property
    def base_url_env(self) -> str:
        """``TOKENWIRE_<NAME>_BASE_URL``, e.g. ``TOKENWIRE_OPENAI_RESPONSES_BASE_URL``."""
        return f"TOKENWIRE_{self.name.upper().replace('-', '_')}_BASE_URL"

    def base_url(self, env: Mapping[str, str] | None = None) -> str:
        """The base URL from the environment, else the default; no trailing slash.

        Raises :class:`ProviderConfigError` when neither is set (providers without a default).
        """
        env = os.environ if env is None else env
        url = (env.get(self.base_url_env) or self.default_base_url).rstrip("/")
        if not url:
            raise ProviderConfigError(self.base_url_env, f"{self.name} has no default base URL")
        return url

    def stream_url(self, env: Mapping[str, str] | None = None) -> str:
        """Where the streaming request goes: base URL + ``stream_path``."""
        return self.base_url(env) + self.stream_path

    def api_key(self, env: Mapping[str, str] | None = None) -> str | None:
        """The credential from its usual variable, or None when unset."""
        env = os.environ if env is None else env
        return env.get(self.api_key_env) if self.api_key_env else None

    def auth_headers(self, api_key: str | None) -> dict[str, str]:
        """The header carrying ``api_key`` in this provider's style (empty without a key)."""
        if not api_key or self.auth == "none":
            return {}
        if self.auth == "bearer":
            return {"Authorization": f"Bearer {api_key}"}
        return {self.auth: api_key}


_CHAT = "/chat/completions"
_CHAT_DIALECT = Dialect.OPENAI_CHAT
ANTHROPIC_VERSION = {"anthropic-version": "2023-06-01"}
"""Anthropic's API refuses requests without a version header: the SDK's current value."""
ANTHROPIC_CALLER_HEADERS = ("anthropic-beta",)
OPENAI_CALLER_HEADERS = ("openai-beta", "openai-organization", "openai-project")
_SPECS: tuple[ProviderSpec, ...] = (
    ProviderSpec(
        name="openai",
        dialect=_CHAT_DIALECT,
        normaliser=OpenAIChatNormaliser,
        default_base_url="https://api.openai.com/v1",
        api_key_env="OPENAI_API_KEY",
        auth="bearer",
        stream_path=_CHAT,
        caller_headers=OPENAI_CALLER_HEADERS,
        legacy_max_tokens=False,
    ),
    ProviderSpec(
        name="openai-responses",
        dialect=Dialect.OPENAI_RESPONSES,
        normaliser=OpenAIResponsesNormaliser,
        default_base_url="https://api.openai.com/v1",
        api_key_env="OPENAI_API_KEY",
        auth="bearer",
        stream_path="/responses",
        caller_headers=OPENAI_CALLER_HEADERS,
    ),
    ProviderSpec(
        name="deepseek",
        dialect=_CHAT_DIALECT,
        normaliser=OpenAIChatNormaliser,
        default_base_url="https://api.deepseek.com/v1",
        api_key_env="DEEPSEEK_API_KEY",
        auth="bearer",
        stream_path=_CHAT,
    ),
    ProviderSpec(
        name="openrouter",
        dialect=_CHAT_DIALECT,
        normaliser=OpenAIChatNormaliser,
        default_base_url="https://openrouter.ai/api/v1",
        api_key_env="OPENROUTER_API_KEY",
        auth="bearer",
        stream_path=_CHAT,
    ),
    ProviderSpec(
        name="groq",
        dialect=_CHAT_DIALECT,
        normaliser=OpenAIChatNormaliser,
        default_base_url="https://api.groq.com/openai/v1",
        api_key_env="GROQ_API_KEY",
        auth="bearer",
        stream_path=_CHAT,
    ),
    # vLLM is self-hosted: the default is its `vllm serve` address; it needs no key by default.
    ProviderSpec(
        name="vllm",
        dialect=_CHAT_DIALECT,
        normaliser=OpenAIChatNormaliser,
        default_base_url="http://127.0.0.1:8000/v1",
        api_key_env="VLLM_API_KEY",
        auth="bearer",
        stream_path=_CHAT,
    ),
    # Azure's base URL names the resource (https://RESOURCE.openai.azure.com/openai/v1): there
    # is no usable default, so TOKENWIRE_AZURE_BASE_URL must be set ("" = required).
    ProviderSpec(
        name="azure",
        dialect=_CHAT_DIALECT,
        normaliser=OpenAIChatNormaliser,
        default_base_url="",
        api_key_env="AZURE_OPENAI_API_KEY",
        auth="api-key",
        stream_path=_CHAT,
    ),
    ProviderSpec(
        name="anthropic",
        dialect=Dialect.ANTHROPIC_MESSAGES,
        normaliser=AnthropicNormaliser,
        default_base_url="https://api.anthropic.com",
        api_key_env="ANTHROPIC_API_KEY",
        auth="x-api-key",
        stream_path="/v1/messages",
        headers=ANTHROPIC_VERSION,
        caller_headers=ANTHROPIC_CALLER_HEADERS,
    ),
    ProviderSpec(
        name="gemini",
        dialect=Dialect.GEMINI,
        normaliser=GeminiNormaliser,
        default_base_url="https://generativelanguage.googleapis.com",
        api_key_env="GEMINI_API_KEY",
        auth="x-goog-api-key",
        stream_path="/v1beta/models/{model}:streamGenerateContent?alt=sse",
    ),
)


def _table() -> dict[str, ProviderSpec]:
    return {spec.name: spec for spec in _SPECS}


_BY_NAME = _table()


def provider_names() -> tuple[str, ...]:
    """Every registered provider name, in table order."""
    return tuple(_BY_NAME)


def get_provider(name: str) -> ProviderSpec:
    """The spec registered under ``name``; :class:`UnknownProviderError` otherwise."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise UnknownProviderError(name, provider_names()) from None
