"""Helpers for the gateway tests: an in-process gateway on fakes, and SDK oracles.

The oracles parse a recorded provider body with the provider's own official SDK (through
``httpx.MockTransport``), independently of anything the gateway does.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai

from tests.fixtures.recordings import recordings_dir
from tokenwire.broker import (
    KeyBook,
    MemoryPublisher,
    MemoryStepRegistry,
    SessionOwnership,
    Topology,
)
from tokenwire.observability import OtelProviders, no_otel
from tokenwire.services.assembler import AssemblerSettings
from tokenwire.services.assembler import run as run_assembler
from tokenwire.services.gateway import (
    CannedUpstream,
    GatewayApp,
    GatewayDeps,
    GatewaySettings,
    MemoryStepSource,
    create_app,
)
from tokenwire.services.gateway._routing.canned import CannedAnswer
from tokenwire.services.gateway._routing.routing import Route

GATEWAY_KEY = "gw-key-SENTINEL-7f3a9c"
OPENAI_KEY = "sk-openai-SENTINEL-1b2c3d4e"
ANTHROPIC_KEY = "sk-ant-SENTINEL-5e6f7a8b"
CLOCK_START_NS = 1_700_000_000_000_000_000


def recording(name: str) -> bytes:
    """The bytes of a recorded provider body, e.g. ``openai/chat-text-include-usage.sse``."""
    return (recordings_dir() / name).read_bytes()


def provider_env(**extra: str) -> dict[str, str]:
    """Provider variables with sentinel credentials and unreachable base URLs."""
    return {
        "OPENAI_API_KEY": OPENAI_KEY,
        "ANTHROPIC_API_KEY": ANTHROPIC_KEY,
        "TOKENWIRE_SCRIPTED_BASE_URL": "http://scripted.invalid",
        **extra,
    }


@dataclass
class Rig:
    """An in-process gateway on in-memory seams."""

    app: GatewayApp
    sink: MemoryPublisher
    steps: MemoryStepRegistry
    upstream: CannedUpstream
    settings: GatewaySettings
    ids: list[str] = field(default_factory=list)

    def client(self, **headers: str) -> httpx.AsyncClient:
        transport = httpx.ASGITransport(app=self.app)
        return httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", headers=headers)

    def openai(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url="http://127.0.0.1/v1",
            api_key=GATEWAY_KEY,
            http_client=self.client(),  # type: ignore[arg-type]  # the SDK takes httpx clients too
            max_retries=0,
        )

    def anthropic(self) -> anthropic.AsyncAnthropic:
        # The anthropic SDK runs on httpx2 (a fork with the same transports).
        transport = httpx2.ASGITransport(app=self.app)
        client = httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1")
        return anthropic.AsyncAnthropic(
            base_url="http://127.0.0.1", api_key=GATEWAY_KEY, http_client=client, max_retries=0
        )

    def envelopes(self) -> list[Any]:
        return [m.envelope for m in self.sink.messages]


def make_rig(
    answer: CannedAnswer | Callable[[Route, bytes], CannedAnswer],
    *,
    sink: MemoryPublisher | None = None,
    otel: OtelProviders | None = None,
    key_book: KeyBook | None = None,
    owners: SessionOwnership | None = None,
    limits_clock_ns: Callable[[], int] = lambda: CLOCK_START_NS + 30 * 10**9,
    **settings: Any,
) -> Rig:
    """A gateway answering every provider call with ``answer``; settings override defaults."""
    answer_fn = answer if callable(answer) else (lambda route, body: answer)
    upstream = CannedUpstream(answer_fn)
    sink = sink or MemoryPublisher()
    steps = MemoryStepRegistry()
    counter = itertools.count()
    ids: list[str] = []

    def new_id() -> str:
        ids.append(f"id{next(counter)}")
        return ids[-1]

    clock = itertools.count(CLOCK_START_NS, 1_000_000)
    deps = GatewayDeps(
        upstream=upstream,
        sink=sink,
        steps=steps,
        clock_ns=lambda: next(clock),
        new_id=new_id,
        otel=otel or no_otel(),
        history=MemoryStepSource(sink),
        keys=key_book,
        owners=owners,
        limits_clock_ns=limits_clock_ns,  # one minute (30 s in): no window boundary in a test
    )
    base = {"keys": frozenset({GATEWAY_KEY}), "provider_env": provider_env()}
    gw_settings = GatewaySettings(**{**base, **settings})
    return Rig(create_app(gw_settings, deps), sink, steps, upstream, gw_settings, ids)


def _mock_client(body: bytes, lib: Any = httpx) -> Any:
    def handler(request: Any) -> Any:
        return lib.Response(200, content=body, headers={"content-type": "text/event-stream"})

    return lib.AsyncClient(transport=lib.MockTransport(handler))


async def openai_oracle(body: bytes) -> dict[str, Any]:
    """Text, tool calls, finish reason and chunk count of a Chat Completions SSE body."""
    client = openai.AsyncOpenAI(base_url="http://p/v1", api_key="x", http_client=_mock_client(body))
    stream = await client.chat.completions.create(model="m", messages=[], stream=True)
    return await collect_openai(stream)


async def collect_openai(stream: Any) -> dict[str, Any]:
    """Fold an openai SDK stream the way an agent would: text, tool calls, finish, usage."""
    text, finish, usage = "", None, None
    calls: dict[int, dict[str, Any]] = {}
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
            for tc in choice.delta.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = tc.id or call["id"]
                call["name"] += (tc.function and tc.function.name) or ""
                call["arguments"] += (tc.function and tc.function.arguments) or ""
    tool_calls = [calls[i] for i in sorted(calls)]
    return {"text": text, "finish": finish, "tool_calls": tool_calls, "usage": usage}


async def anthropic_oracle(body: bytes) -> Any:
    """The final message the anthropic SDK assembles from a Messages SSE body."""
    client = anthropic.AsyncAnthropic(
        base_url="http://p", api_key="x", http_client=_mock_client(body, httpx2)
    )
    async with client.messages.stream(model="m", max_tokens=10, messages=[]) as stream:
        return await stream.get_final_message()


def tool_uses(message: Any) -> list[tuple[str, str, Any]]:
    """(id, name, input) of every tool_use block of an anthropic SDK message."""
    return [(b.id, b.name, b.input) for b in message.content if b.type == "tool_use"]


def text_of(message: Any) -> str:
    return "".join(b.text for b in message.content if b.type == "text")


def recordings_path() -> Path:
    return recordings_dir()


async def stored_by_burst(broker_url: str, tmp: Path) -> str:
    """The URL of a SQLite store in ``tmp`` that a burst assembler filled from the broker's
    retained chunks (what the real-process tests check their steps against)."""
    store_url = f"sqlite:///{tmp / 'store.db'}"
    await run_assembler(
        AssemblerSettings(
            nats_urls=(broker_url,),
            store_url=store_url,
            topology=Topology(),
            burst=True,
            metrics_addr=None,
            provision=False,
            tune_gc=False,
        )
    )
    return store_url
