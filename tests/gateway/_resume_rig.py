"""What the resume tests share: a real nats-server, the scripted provider on a socket, a
gateway under test and a reference gateway (each on a topology of its own, so one session id
can run on both), the official SDKs, and a caller that cuts its connection at a chosen point.

The oracle of a resumed step is the answer the official SDK assembled from an uninterrupted
run of the same request (same session, turn and step) through the reference gateway: the
same bytes from the scripted provider (its clock is fixed), the same gateway names (ids made
from the step; the gateways' clocks are one fixed counter).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import random
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import anthropic
import httpx
import httpx2
import openai
from nats.aio.client import Client

from tests.assembler.harness import settings_for as assembler_settings
from tests.fixtures.broker import drop_topology, fresh_topology
from tests.gateway._helpers import ANTHROPIC_KEY, GATEWAY_KEY, OPENAI_KEY
from tokenwire.broker import Topology, ensure_topology
from tokenwire.services.assembler import run as run_assembler
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.services.scripted_provider import ScriptedServer, ScriptedSettings
from tokenwire.store import open_store

SCRIPTED = ScriptedSettings(seed=29, length=12, sentinel="RESUME")
CLOCK_BASE_NS = 1_760_000_000_000_000_000
CALLERS = ("chat", "messages", "responses")
PROVIDERS = ("openai", "anthropic")  # the two dialects the scripted provider serves for real
CUTS = ("before-first-byte", "mid-text", "mid-tool-call", "after-finish")
PATHS = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}
# What a caller's raw event looks like in each phase (its SSE data, as the dialect writes it).
TEXT = {"chat": '"content":"', "messages": "text_delta", "responses": "output_text.delta"}
TOOL = {
    "chat": '"arguments":"',
    "messages": "input_json_delta",
    "responses": "function_call_arguments.delta",
}
FINISH = {
    "chat": '"finish_reason":"',
    "messages": "message_delta",
    "responses": "response.completed",
}


def settings_for(
    scripted_url: str,
    topology: Topology,
    *,
    upstream_env: Mapping[str, str] | None = None,
    **over: Any,
) -> GatewaySettings:
    """``upstream_env``: more provider variables (another upstream's base URL and key)."""
    env = {
        "OPENAI_API_KEY": OPENAI_KEY,
        "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
        "TOKENWIRE_SCRIPTED_BASE_URL": scripted_url,
        "TOKENWIRE_OPENAI_BASE_URL": scripted_url + "/v1",
        "TOKENWIRE_ANTHROPIC_BASE_URL": scripted_url,
        **(upstream_env or {}),
    }
    base: dict[str, Any] = {
        "port": 0,
        "keys": frozenset({GATEWAY_KEY}),
        "provider_env": env,
        "partitions": topology.partitions,
        "ack_timeout_s": 10.0,
    }
    return GatewaySettings(**{**base, **over})


@contextlib.asynccontextmanager
async def gateway(
    nc: Client,
    topology: Topology,
    scripted_url: str,
    clock: Any,
    *,
    upstream_env: Mapping[str, str] | None = None,
    **over: Any,
) -> AsyncIterator[str]:
    """A gateway on ``topology`` with the injected clock; yields its URL."""
    real = await broker_deps(nc, topology)
    deps = dataclasses.replace(real.deps, clock_ns=clock)
    settings = settings_for(scripted_url, topology, upstream_env=upstream_env, **over)
    try:
        async with GatewayServer(settings, deps) as server:
            yield server.url
    finally:
        await real.aclose()


@dataclass
class Case:
    """One cut-and-retry: a caller dialect, a provider dialect, where the cut falls."""

    caller: str
    provider: str
    cut: str
    session: str
    rng: random.Random
    most: int = 4
    """A mid-phase cut falls after 1 to ``most`` of the phase's events (drawn by ``rng``)."""

    @property
    def scenario(self) -> str:
        return "tools" if self.cut == "mid-tool-call" else "text"

    @property
    def headers(self) -> dict[str, str]:
        return {
            "x-tokenwire-session": self.session,
            "x-tokenwire-turn": "0",
            "x-tokenwire-step": "0",
        }

    def model(self) -> str:
        return f"{self.provider}/{self.scenario}"


@dataclass
class Sent:
    """The request bodies the SDK sent (captured by an httpx event hook)."""

    bodies: list[bytes] = field(default_factory=list)

    async def hook(self, request: Any) -> None:
        self.bodies.append(request.content)


def openai_client(url: str, sent: Sent, retries: int = 0) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(event_hooks={"request": [sent.hook]}, timeout=30)
    return openai.AsyncOpenAI(
        base_url=url + "/v1",
        api_key=GATEWAY_KEY,
        max_retries=retries,
        http_client=http,  # type: ignore[arg-type]  # the SDK takes httpx clients too
    )


def anthropic_client(url: str, sent: Sent, retries: int = 0) -> anthropic.AsyncAnthropic:
    http = httpx2.AsyncClient(event_hooks={"request": [sent.hook]}, timeout=30)
    return anthropic.AsyncAnthropic(
        base_url=url, api_key=GATEWAY_KEY, http_client=http, max_retries=retries
    )


async def final_answer(url: str, case: Case, sent: Sent, retries: int = 0) -> dict[str, Any]:
    """The answer the official SDK assembles for the case's request (streamed)."""
    user = [{"role": "user", "content": "resume me"}]
    headers = case.headers
    if case.caller == "messages":
        async with (
            anthropic_client(url, sent, retries) as client,
            client.messages.stream(
                model=case.model(),
                max_tokens=100,
                messages=user,  # type: ignore[arg-type]
                extra_headers=headers,
            ) as stream,
        ):
            return (await stream.get_final_message()).model_dump()
    async with openai_client(url, sent, retries) as oa:
        if case.caller == "chat":
            async with oa.chat.completions.stream(
                model=case.model(),
                messages=user,  # type: ignore[arg-type]
                extra_headers=headers,
            ) as chat:
                return (await chat.get_final_completion()).model_dump()
        async with oa.responses.stream(
            model=case.model(), input="resume me", extra_headers=headers
        ) as responses:
            return (await responses.get_final_response()).model_dump()


async def cut_run(url: str, case: Case, body: bytes) -> int:
    """Send the request as the SDK did and drop the connection at the case's cut point;
    returns the bytes read."""
    headers = {
        **case.headers,
        "authorization": f"Bearer {GATEWAY_KEY}",
        "content-type": "application/json",
    }
    if case.caller == "messages":
        headers["anthropic-version"] = "2023-06-01"
    read = 0
    async with httpx.AsyncClient(timeout=30) as client:
        request = client.build_request(
            "POST", url + PATHS[case.caller], content=body, headers=headers
        )
        response = await client.send(request, stream=True)
        try:
            assert response.status_code == 200, await response.aread()
            if case.cut == "before-first-byte":
                return 0
            wanted = _marker(case)
            left = case.rng.randint(1, case.most) if case.cut != "after-finish" else 1
            async for line in response.aiter_lines():
                read += len(line) + 1
                if line.startswith("data:") and wanted in line:
                    left -= 1
                    if left == 0:
                        return read
            raise AssertionError(f"{case}: the stream ended before its cut point")
        finally:
            await response.aclose()  # the connection goes: the gateway sees the caller leave


def _marker(case: Case) -> str:
    if case.cut == "mid-text":
        return TEXT[case.caller]
    if case.cut == "mid-tool-call":
        return TOOL[case.caller]
    return FINISH[case.caller]


def cases(caller: str, seed: int) -> list[Case]:
    """Every provider and cut point for ``caller``, each in a session of its own."""
    rng = random.Random(seed)
    tag = rng.randrange(1 << 30)
    return [
        Case(caller, provider, cut, f"resume-{tag}-{caller}-{provider}-{cut}", rng)
        for provider, cut in itertools.product(PROVIDERS, CUTS)
    ]


def fixed_clock() -> Any:
    """One clock for both gateways: the same ``created`` on both, whenever they run."""
    counter = itertools.count(CLOCK_BASE_NS, 1000)
    return lambda: next(counter)


@contextlib.asynccontextmanager
async def scripted_server() -> AsyncIterator[ScriptedServer]:
    async with ScriptedServer(SCRIPTED, clock=lambda: 1_760_000_000) as server:
        yield server


async def stored_messages(
    nats_url: str, topology: Topology, store_url: str, session: str
) -> list[Any]:
    """The assembler, run to the end of the stream (burst), then the session's stored rows."""
    await run_assembler(assembler_settings(nats_url, topology, store_url))
    store = open_store(store_url)
    try:
        return list(await store.messages(session))
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def reference_topology(nc: Client) -> AsyncIterator[Topology]:
    t = fresh_topology()
    await ensure_topology(nc, t)
    try:
        yield t
    finally:
        await drop_topology(nc, t)
