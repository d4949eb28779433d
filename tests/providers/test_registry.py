"""The provider table: names, URLs from the environment, credentials, auth headers."""

from __future__ import annotations

import pytest

from tokenwire import providers
from tokenwire.providers import (
    OpenAIChatNormaliser,
    OpenAIResponsesNormaliser,
    ProviderConfigError,
    UnknownProviderError,
    get_provider,
    is_retryable,
)


def test_interface_names_are_registered_with_their_dialects() -> None:
    expected = {
        "openai": ("openai-chat", OpenAIChatNormaliser),
        "openai-responses": ("openai-responses", OpenAIResponsesNormaliser),
        "deepseek": ("openai-chat", OpenAIChatNormaliser),
        "openrouter": ("openai-chat", OpenAIChatNormaliser),
        "groq": ("openai-chat", OpenAIChatNormaliser),
        "vllm": ("openai-chat", OpenAIChatNormaliser),
        "azure": ("openai-chat", OpenAIChatNormaliser),
    }
    for name, (dialect, normaliser) in expected.items():
        spec = get_provider(name)
        assert (spec.dialect, spec.normaliser) == (dialect, normaliser)
        assert isinstance(spec.normaliser(), normaliser)


def test_urls_follow_the_sdk_convention_and_the_environment() -> None:
    openai = get_provider("openai")
    assert openai.stream_url({}) == "https://api.openai.com/v1/chat/completions"
    env = {"TOKENWIRE_OPENAI_BASE_URL": "http://127.0.0.1:9/v1/"}
    assert openai.stream_url(env) == "http://127.0.0.1:9/v1/chat/completions"
    responses = get_provider("openai-responses")
    assert responses.base_url_env == "TOKENWIRE_OPENAI_RESPONSES_BASE_URL"
    assert responses.stream_url({}) == "https://api.openai.com/v1/responses"
    assert get_provider("deepseek").stream_url({}) == "https://api.deepseek.com/v1/chat/completions"


def test_azure_needs_its_base_url() -> None:
    with pytest.raises(ProviderConfigError) as info:
        get_provider("azure").base_url({})
    assert info.value.variable == "TOKENWIRE_AZURE_BASE_URL"


def test_credentials_and_auth_headers() -> None:
    env = {"DEEPSEEK_API_KEY": "k1", "AZURE_OPENAI_API_KEY": "k2"}
    deepseek = get_provider("deepseek")
    assert deepseek.auth_headers(deepseek.api_key(env)) == {"Authorization": "Bearer k1"}
    azure = get_provider("azure")
    assert azure.auth_headers(azure.api_key(env)) == {"api-key": "k2"}
    assert get_provider("groq").api_key(env) is None
    assert get_provider("groq").auth_headers(None) == {}
    names = {get_provider(n).api_key_env for n in ("openai", "openrouter", "groq")}
    assert names == {"OPENAI_API_KEY", "OPENROUTER_API_KEY", "GROQ_API_KEY"}


def test_unknown_provider_is_a_typed_lookup_error() -> None:
    with pytest.raises(UnknownProviderError) as info:
        get_provider("nope")
    assert info.value.name == "nope"
    assert "openai" in info.value.known
    assert isinstance(info.value, LookupError)


@pytest.mark.parametrize(
    ("status", "code", "retryable"),
    [
        (429, "rate_limit_exceeded", True),
        (429, "insufficient_quota", False),
        (None, "overloaded_error", True),
        (400, "tool_use_failed", False),
        (400, "invalid_request_error", False),
        (500, None, True),
        (None, None, False),
        (404, None, False),
    ],
)
def test_is_retryable(status: int | None, code: str | None, retryable: bool) -> None:
    assert is_retryable(status, code) is retryable


def test_all_lists_the_public_names_exactly() -> None:
    public = {n for n in dir(providers) if not n.startswith("_") and n != "annotations"}
    assert set(providers.__all__) <= public
    assert all(getattr(providers, n) is not None for n in providers.__all__)
