"""A real stack for the threading tests: gateways over real sockets on one real nats-server,
the scripted provider behind them, and a tap that counts every JetStream API request (reads)
the stack sends, as the broker sees them (an independent oracle, not the gateway's metrics).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from tests.gateway._helpers import GATEWAY_KEY, provider_env
from tokenwire.broker import Topology
from tokenwire.replay import read_session
from tokenwire.schemas import ChunkEnvelope, StepLink
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.services.scripted_provider import ScriptedServer, ScriptedSettings
from tokenwire.store import Store

SCRIPTED = ScriptedSettings(seed=49, length=4)


@dataclass
class ApiTap:
    """Every ``$JS.API.>`` request on the broker (stream and KV reads, consumer calls) by
    subject, counted from :meth:`reset`."""

    subjects: list[str] = field(default_factory=list)
    seen: int = 0

    async def on(self, msg: Msg) -> None:
        self.seen += 1
        self.subjects.append(msg.subject)

    def reset(self) -> None:
        self.subjects.clear()

    def reads(self) -> list[str]:
        """The read requests: a stored message by sequence or subject (``MSG.GET``,
        ``DIRECT.GET``), a stream's info, or a consumer's creation."""
        kinds = ("MSG.GET", "DIRECT.GET", "STREAM.INFO", "CONSUMER.CREATE")
        return [s for s in self.subjects if any(k in s for k in kinds)]


@dataclass
class Stack:
    """Gateway URLs (one or more instances), the scripted provider, the tap."""

    urls: list[str]
    scripted: ScriptedServer
    tap: ApiTap
    nc: Client
    topology: Topology
    sub: Subscription

    async def settle(self) -> None:
        """Wait until the tap handled every request the server delivered to it (a flush
        round trip, then its callbacks; bounded)."""
        await self.sub._conn.flush()
        async with asyncio.timeout(5):
            while self.tap.seen < self.sub.delivered:  # noqa: ASYNC110 - nats-py's own counter
                await asyncio.sleep(0.01)

    async def first_chunks(self, session: str) -> dict[tuple[int, int], ChunkEnvelope]:
        """Each step's first chunk as the broker holds it: ``(turn, step) -> envelope``."""
        out: dict[tuple[int, int], ChunkEnvelope] = {}
        async for event in read_session(self.nc, self.topology, session):
            if event.envelope.ordinal == 0:
                out[event.step_key] = event.envelope
        return out

    async def parents(self, session: str) -> dict[tuple[int, int], StepLink | None]:
        """Each step's recorded parent."""
        firsts = await self.first_chunks(session)
        return {
            key: env.parent if isinstance(env.parent, StepLink) else None
            for key, env in firsts.items()
        }


@contextlib.asynccontextmanager
async def threading_stack(
    nats_url: str,
    nc: Client,
    topology: Topology,
    *,
    gateways: int = 1,
    store: Store | None = None,
    env: dict[str, str] | None = None,
) -> AsyncIterator[Stack]:
    """``gateways`` gateway instances sharing one broker and the scripted provider (and
    ``store``, where steps gone from the broker are read back from)."""
    tap = ApiTap()
    watcher = await nats.connect(nats_url)
    sub = await watcher.subscribe("$JS.API.>", cb=tap.on)
    await watcher.flush()
    async with ScriptedServer(SCRIPTED) as scripted, contextlib.AsyncExitStack() as stack:
        providers = provider_env(
            TOKENWIRE_ANTHROPIC_BASE_URL=scripted.url,
            TOKENWIRE_OPENAI_BASE_URL=scripted.url + "/v1",
            TOKENWIRE_SCRIPTED_BASE_URL=scripted.url,
            **(env or {}),
        )
        urls = []
        for _ in range(gateways):
            real = await broker_deps(nc, topology, store=(lambda: store) if store else None)
            stack.push_async_callback(real.aclose)
            settings = GatewaySettings(
                port=0,
                keys=frozenset({GATEWAY_KEY}),
                provider_env=providers,
                partitions=topology.partitions,
                ack_timeout_s=10.0,
            )
            server = await stack.enter_async_context(GatewayServer(settings, real.deps))
            urls.append(server.url)
        try:
            yield Stack(urls, scripted, tap, nc, topology, sub)
        finally:
            await watcher.close()
