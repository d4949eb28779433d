"""The provider table: name -> wire dialect, normaliser, default base URL, env vars, auth.

Adding a provider is one row in ``_SPECS`` below, e.g. (for the Anthropic/Gemini work)::

    ProviderSpec("anthropic", "anthropic-messages", AnthropicNormaliser,
                 "https://api.anthropic.com", "ANTHROPIC_API_KEY", "x-api-key", "/v1/messages"),

``name`` is the routing / ``fold --provider`` name; the base-URL variable is derived from it
(``TOKENWIRE_<NAME>_BASE_URL``, dashes as underscores). Each base URL follows its provider
SDK's convention (OpenAI's and DeepSeek's include ``/v1``, Anthropic's does not), and
``stream_path`` is appended to it. Gemini puts the model in the path: use ``{model}`` there.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from tokenwire.providers._anthropic import AnthropicNormaliser
from tokenwire.providers._base import Normaliser
from tokenwire.providers._errors import ProviderConfigError, UnknownProviderError
from tokenwire.providers._gemini import GeminiNormaliser
from tokenwire.providers._openai_chat import OpenAIChatNormaliser
from tokenwire.providers._openai_responses import OpenAIResponsesNormaliser

Dialect = Literal["openai-chat", "openai-responses", "anthropic-messages", "gemini", "scripted"]
"""The wire formats tokenwire speaks; several providers share ``openai-chat``."""

AuthStyle = Literal["bearer", "x-api-key", "api-key", "x-goog-api-key", "none"]
"""How the credential is sent: ``Authorization: Bearer``, or the named header."""


@dataclass(frozen=True, slots=True)
class ProviderSpec:
    """One provider: how to reach it and how to read its stream."""

    name: str
    dialect: Dialect
    normaliser: Callable[[], Normaliser]
    default_base_url: str
    api_key_env: str | None
    auth: AuthStyle
    stream_path: str

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
_SPECS: tuple[ProviderSpec, ...] = (
    # name, dialect, normaliser, default base URL, credential env, auth style, stream path
    ProviderSpec("openai", "openai-chat", OpenAIChatNormaliser, "https://api.openai.com/v1",
                 "OPENAI_API_KEY", "bearer", _CHAT),
    ProviderSpec("openai-responses", "openai-responses", OpenAIResponsesNormaliser,
                 "https://api.openai.com/v1", "OPENAI_API_KEY", "bearer", "/responses"),
    ProviderSpec("deepseek", "openai-chat", OpenAIChatNormaliser, "https://api.deepseek.com/v1",
                 "DEEPSEEK_API_KEY", "bearer", _CHAT),
    ProviderSpec("openrouter", "openai-chat", OpenAIChatNormaliser,
                 "https://openrouter.ai/api/v1", "OPENROUTER_API_KEY", "bearer", _CHAT),
    ProviderSpec("groq", "openai-chat", OpenAIChatNormaliser, "https://api.groq.com/openai/v1",
                 "GROQ_API_KEY", "bearer", _CHAT),
    # vLLM is self-hosted: the default is its `vllm serve` address; it needs no key by default.
    ProviderSpec("vllm", "openai-chat", OpenAIChatNormaliser, "http://127.0.0.1:8000/v1",
                 "VLLM_API_KEY", "bearer", _CHAT),
    # Azure's base URL names the resource (https://RESOURCE.openai.azure.com/openai/v1): there
    # is no usable default, so TOKENWIRE_AZURE_BASE_URL must be set ("" = required).
    ProviderSpec("azure", "openai-chat", OpenAIChatNormaliser, "", "AZURE_OPENAI_API_KEY",
                 "api-key", _CHAT),
    ProviderSpec("anthropic", "anthropic-messages", AnthropicNormaliser,
                 "https://api.anthropic.com", "ANTHROPIC_API_KEY", "x-api-key", "/v1/messages"),
    ProviderSpec("gemini", "gemini", GeminiNormaliser, "https://generativelanguage.googleapis.com",
                 "GEMINI_API_KEY", "x-goog-api-key",
                 "/v1beta/models/{model}:streamGenerateContent?alt=sse"),
)  # fmt: skip


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
