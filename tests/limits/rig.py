"""The limit tests' rig: the real gateway on a socket in front of the hostile upstream,
publishing to the fixtures' real nats-server (default 1 MiB max_payload); the assembler (burst
mode) folds what the broker holds into a real SQLite store."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
from nats.aio.client import Client

from tests.assembler.harness import settings_for
from tests.gateway._helpers import GATEWAY_KEY, provider_env
from tests.limits.hostile import HostileUpstream, Scenario
from tokenwire.broker import Topology
from tokenwire.schemas import ErrorEvent, Message, MessageEvent, RecordedError
from tokenwire.services.assembler import run as run_assembler
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.store import open_store

AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}


@dataclass
class Rig:
    url: str
    nc: Client
    topology: Topology
    nats_url: str
    store_url: str
    upstream: HostileUpstream

    def openai(self, session: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{self.url}/v1",
            api_key=GATEWAY_KEY,
            max_retries=0,
            timeout=120,
            default_headers={"X-Tokenwire-Session": session},
        )

    async def recorded(self, session: str) -> Message | RecordedError:
        """Drain the broker into the store (burst assembler); the session's one outcome."""
        return (await self.recorded_all([session]))[0]

    async def recorded_all(self, sessions: list[str]) -> list[Message | RecordedError]:
        """:meth:`recorded` for several sessions, with one drain."""
        await run_assembler(settings_for(self.nats_url, self.topology, self.store_url))
        store = open_store(self.store_url)
        found: list[Message | RecordedError] = []
        try:
            for session in sessions:
                events = await store.session_events(session)
                outcomes = [e for e in events if isinstance(e, MessageEvent | ErrorEvent)]
                assert len(outcomes) == 1, (session, outcomes)
                outcome = outcomes[0]
                found.append(
                    outcome.message if isinstance(outcome, MessageEvent) else outcome.error
                )
        finally:
            await store.close()
        return found

    async def health(self) -> tuple[int, int]:
        async with httpx.AsyncClient(base_url=self.url) as client:
            healthz = await client.get("/healthz")
            readyz = await client.get("/readyz")
        return healthz.status_code, readyz.status_code


@contextlib.asynccontextmanager
async def limit_rig(
    nc: Client,
    topology: Topology,
    nats_url: str,
    store_url: str,
    extra: dict[str, Scenario] | None = None,
    **settings: Any,
) -> AsyncIterator[Rig]:
    async with HostileUpstream(extra) as upstream:
        real = await broker_deps(nc, topology)
        gateway = GatewaySettings(
            port=0,
            keys=frozenset({GATEWAY_KEY}),
            provider_env=provider_env(TOKENWIRE_OPENAI_BASE_URL=f"{upstream.url}/v1"),
            partitions=topology.partitions,
            ack_timeout_s=30.0,
            **settings,
        )
        try:
            async with GatewayServer(gateway, real.deps) as server:
                yield Rig(server.url, nc, topology, nats_url, store_url, upstream)
        finally:
            await real.aclose()


async def stream_text(client: openai.AsyncOpenAI, model: str) -> tuple[str, list[str], str]:
    """Stream one completion with the SDK: (text, tool-call arguments, finish reason or the
    error the stream ended with)."""
    text, args, ending = "", [""], ""
    try:
        stream = await client.chat.completions.create(
            model=f"openai/{model}", stream=True, messages=[{"role": "user", "content": "x"}]
        )
        async for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                for call in choice.delta.tool_calls or []:
                    args[0] += (call.function.arguments or "") if call.function else ""
                ending = choice.finish_reason or ending
    except openai.APIError as exc:
        ending = f"error: {exc.message}"
    finally:
        await client.close()
    return text, args, ending
