"""The dialect layer: one Dialect type, every member handled, provider quirks on the spec."""

from __future__ import annotations

from typing import get_args

import msgspec
import pytest

from tests.gateway._helpers import provider_env
from tokenwire.providers import Dialect, get_provider, provider_names
from tokenwire.schemas import TextBlock
from tokenwire.services.gateway._dialects import (
    ANTHROPIC_MESSAGES,
    OPENAI_CHAT,
    OPENAI_RESPONSES,
    CallerDialect,
)
from tokenwire.services.gateway._dialects.neutral import NeutralMessage, NeutralRequest
from tokenwire.services.gateway._routing.provider_call import translated
from tokenwire.services.gateway._routing.routing import resolve

HELLO = NeutralRequest(messages=[NeutralMessage("user", [TextBlock(text="hi")])], max_tokens=7)


def test_each_caller_dialect_has_its_codec() -> None:
    codecs = {c.dialect: c for c in (OPENAI_CHAT, ANTHROPIC_MESSAGES, OPENAI_RESPONSES)}
    assert set(codecs) == set(get_args(CallerDialect))
    assert all(isinstance(d, Dialect) for d in codecs)
    assert {d.value for d in Dialect} >= {"openai-chat", "anthropic-messages", "gemini"}


@pytest.mark.parametrize("name", provider_names())
def test_every_provider_dialect_has_a_translation(name: str) -> None:
    env = provider_env(GEMINI_API_KEY="g", TOKENWIRE_AZURE_BASE_URL="http://azure.invalid")
    route = resolve(f"{name}/m-1", Dialect.OPENAI_CHAT, env)
    assert route.dialect is get_provider(name).dialect
    body, _ = translated(HELLO, route, 4096)
    sent = msgspec.json.decode(body)
    if route.dialect is Dialect.GEMINI:
        assert sent["contents"] == [{"role": "user", "parts": [{"text": "hi"}]}]
        assert "/models/m-1:" in route.url  # Gemini names the model in the path
    else:
        assert sent["model"] == "m-1"


def test_provider_quirks_come_from_the_spec() -> None:
    env = provider_env(DEEPSEEK_API_KEY="d")
    openai = resolve("openai/m", Dialect.ANTHROPIC_MESSAGES, env)
    deepseek = resolve("deepseek/m", Dialect.ANTHROPIC_MESSAGES, env)
    assert "max_completion_tokens" in msgspec.json.decode(translated(HELLO, openai, 1)[0])
    assert msgspec.json.decode(translated(HELLO, deepseek, 1)[0])["max_tokens"] == 7
    anthropic = resolve("anthropic/m", Dialect.OPENAI_CHAT, env)
    assert anthropic.headers["anthropic-version"] == "2023-06-01"
    assert anthropic.caller_headers == ("anthropic-beta",)
    assert deepseek.caller_headers == ()
