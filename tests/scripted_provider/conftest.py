"""Fixtures: the scripted provider on a real socket (port 0), and the official SDK clients on it."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anthropic
import openai
import pytest

from tokenwire.services.scripted_provider import ScriptedServer, ScriptedSettings

FIXED_CLOCK = 1_754_688_929.0
"""The injected clock: OpenAI's ``created`` is deterministic in every test."""

SETTINGS = ScriptedSettings(seed=7, length=6, fragment_size=5, stall_s=30.0)


@pytest.fixture
def settings() -> ScriptedSettings:
    return SETTINGS


@pytest.fixture
async def server(settings: ScriptedSettings) -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer(settings, clock=lambda: FIXED_CLOCK) as running:
        yield running


@pytest.fixture
async def openai_client(server: ScriptedServer) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)
    async with client:
        yield client


@pytest.fixture
async def anthropic_client(server: ScriptedServer) -> AsyncIterator[anthropic.AsyncAnthropic]:
    client = anthropic.AsyncAnthropic(base_url=server.url, api_key="x", max_retries=0)
    async with client:
        yield client
