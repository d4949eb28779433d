"""An assigned step's claim runs beside the provider (issue 47, ADR 0043) and still gives
every step one claimed identity (ADR 0022) and a durable first chunk.

Real parts: two in-process gateways on real sockets, each with its own registry client on one
real nats-server (the step registry's KV bucket), the scripted provider on a socket, the
OpenAI wire over httpx. The provider request goes out before the claim's writes; concurrent
first steps of one new session through both gateways still get one claim each, echoed in the
response head and carried by exactly one first chunk on the stream, acknowledged before the
caller's stream ended.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.gateway._helpers import GATEWAY_KEY, provider_env
from tests.gateway.test_gateway_real import read_stream
from tokenwire.broker import msg_id
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.services.scripted_provider import ScriptedServer, ScriptedSettings

AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
CALLERS = 6
SCRIPTED = ScriptedSettings(seed=47, length=6, first_token_s=0.02)


class _Recorded:
    """A dependency whose named methods append their name to ``log`` before they run."""

    def __init__(self, inner: Any, log: list[str], **names: str) -> None:
        self._inner, self._log, self._names = inner, log, names

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._inner, attr)
        if attr not in self._names:
            return value

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self._log.append(self._names[attr])
            return value(*args, **kwargs)

        return recorded


@pytest.fixture
async def scripted() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer(SCRIPTED) as server:
        yield server


def _settings(scripted: ScriptedServer, partitions: int) -> GatewaySettings:
    return GatewaySettings(
        port=0,
        keys=frozenset({GATEWAY_KEY}),
        provider_env=provider_env(TOKENWIRE_SCRIPTED_BASE_URL=scripted.url),
        partitions=partitions,
        ack_timeout_s=10.0,
    )


async def _stream(client: httpx.AsyncClient, url: str, session: str) -> tuple[int, int, str]:
    """One streamed conversation-opening request to ``session``: (turn, step, body)."""
    body = {"model": "scripted/text", "messages": [{"role": "user", "content": "hi"}]}
    headers = {**AUTH, "x-tokenwire-session": session}
    path = f"{url}/v1/chat/completions"
    async with client.stream("POST", path, json={**body, "stream": True}, headers=headers) as r:
        text = (await r.aread()).decode()
    assert r.status_code == 200, text
    return int(r.headers["x-tokenwire-turn"]), int(r.headers["x-tokenwire-step"]), text


async def test_the_provider_request_goes_out_before_the_claims_writes(
    nc, topology, scripted
) -> None:
    real = await broker_deps(nc, topology)
    order: list[str] = []
    deps = dataclasses.replace(
        real.deps,
        upstream=_Recorded(real.deps.upstream, order, send="provider"),
        steps=_Recorded(real.deps.steps, order, begin_next_step="claim"),
    )
    try:
        async with (
            GatewayServer(_settings(scripted, topology.partitions), deps) as gateway,
            httpx.AsyncClient(timeout=30) as client,
        ):
            turn, step, text = await _stream(client, gateway.url, f"s-{uuid.uuid4().hex}")
    finally:
        await real.aclose()
    assert (turn, step) == (0, 0)
    assert text.rstrip().endswith("data: [DONE]")
    assert order == ["provider", "claim"]


async def test_concurrent_first_steps_are_claimed_once_each_and_their_first_chunks_durable(
    nc, topology, scripted
) -> None:
    """Every request opens the same new session at once, half through each gateway: each
    guesses the session new and sends (0, 0); the registry gives each a step of its own.
    Numbered without the registry (in each gateway's memory), two requests would share a
    triple, and the stream's dedupe would merge their first chunks."""
    session = f"s-{uuid.uuid4().hex}"
    a, b = await broker_deps(nc, topology), await broker_deps(nc, topology)
    settings = _settings(scripted, topology.partitions)
    try:
        async with (
            GatewayServer(settings, a.deps) as one,
            GatewayServer(settings, b.deps) as two,
            httpx.AsyncClient(timeout=30) as client,
        ):
            urls = [one.url, two.url]
            answers = await asyncio.gather(
                *(_stream(client, urls[i % 2], session) for i in range(CALLERS))
            )
        triples = sorted((turn, step) for turn, step, _ in answers)
        assert len(set(triples)) == CALLERS  # one identity per step
        for turn, step in triples:  # each one claimed in the registry
            assert await a.deps.steps.record(session, turn, step) is not None
    finally:
        await a.aclose()
        await b.aclose()
    # Acknowledged before each caller's stream ended: on the stream now, read back.
    stored = [s for s in await read_stream(nc, topology) if s.envelope.session == session]
    firsts = [s for s in stored if s.envelope.ordinal == 0]
    assert sorted((s.envelope.turn, s.envelope.step) for s in firsts) == triples
    for s in firsts:  # alone on the session's ``.first`` subject, under the claimed triple
        env = s.envelope
        assert s.subject.endswith(".first")
        assert s.headers["Nats-Msg-Id"] == msg_id(session, env.turn, env.step, 0)
    for _, _, text in answers:
        assert text.rstrip().endswith("data: [DONE]")
