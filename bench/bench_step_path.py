"""The gateway's own work per provider read, in process, on in-memory seams (issue 47).

One paced provider read brings one token; what the gateway does with it (SSE parse,
normalise, meter, frame, fold, forward to the caller) is plain Python on one core. This
part runs the real app (``create_app``) on the broker's memory twins and an upstream that
hands over one recorded event per read, with an ASGI ``send`` that only counts bytes: no
sockets, no event-loop wake-ups, so what it measures is the interpreted per-read work the
paced bench (``floor``) sees beside its system calls. Requests run one after another, each
a fresh session of :data:`TOKENS` text events at full speed; the figure is the process's CPU
per token (best of :data:`REPEATS`). Run: ``python -m bench step_path``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import msgspec
import uvloop

from tokenwire.broker import MemoryStepRegistry
from tokenwire.observability import no_otel
from tokenwire.providers import Normaliser
from tokenwire.schemas import StreamChunk
from tokenwire.services.gateway import GatewayDeps, GatewaySettings, create_app
from tokenwire.services.gateway._routing.routing import Route

try:
    from tokenwire.services.gateway._output.caller import BODY_NOW
except ImportError:  # a tree before it (the bench's baseline)
    BODY_NOW = "tokenwire.body_now"
from tokenwire.sse import SseParser

TOKENS, REQUESTS, REPEATS = 100, 300, 5
FIGURES: dict[str, float] = {}


def _event(payload: dict[str, Any]) -> bytes:
    return b"data: " + msgspec.json.encode(payload) + b"\n\n"


def paced_reads(tokens: int) -> list[bytes]:
    """A Chat Completions stream as the scripted provider sends it, one event per read."""
    head = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 1796659833,
            "model": "text", "system_fingerprint": "fp_scripted"}  # fmt: skip

    def choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        one = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**head, "choices": [one], "usage": None}

    reads = [_event(choice({"role": "assistant", "content": ""}))]
    reads += [_event(choice({"content": f"w{i:03d}"})) for i in range(tokens)]
    reads.append(_event(choice({}, "stop")))
    usage = {"prompt_tokens": 10, "completion_tokens": tokens, "total_tokens": tokens + 10}
    reads.append(_event({**head, "choices": [], "usage": usage}))
    return [*reads, b"data: [DONE]\n\n"]


@dataclass
class _Call:
    reads: list[bytes]

    def batches(
        self, normaliser: Normaliser, every_s: float = 0.0
    ) -> AsyncGenerator[list[StreamChunk], None]:
        return self._batches(normaliser)

    async def _batches(self, normaliser: Normaliser) -> AsyncGenerator[list[StreamChunk], None]:
        parser = SseParser()  # as providers._stream._batches reads a response
        for data in self.reads:
            batch: list[StreamChunk] = []
            for event in parser.feed(data):
                batch += normaliser.feed(event)
            yield batch
        yield normaliser.close()

    def cancel(self) -> None:
        pass


@dataclass
class _Upstream:
    reads: list[bytes]

    def send(self, route: Route, body: bytes) -> _Call:
        return _Call(self.reads)


@dataclass
class _Sink:
    """The broker's publisher, counting what it is given (acked at once)."""

    frames: int = 0
    max_payload: int = 1024 * 1024
    sizes: list[int] = field(default_factory=list)

    async def publish(self, payload: bytes, *args: object, **kwargs: object) -> None:
        self.frames += 1

    async def wait_acked(self, *args: object, **kwargs: object) -> None:
        return None


async def _request(app: Any, body: bytes, session: str) -> int:
    sent, status = 0, 0
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def receive() -> dict[str, Any]:
        if pending:
            return pending.pop()
        await never
        return {"type": "http.disconnect"}

    def written(data: bytes) -> bool:  # the gateway's server writes body pieces so
        nonlocal sent
        sent += len(data)
        return True

    async def send(message: dict[str, Any]) -> None:
        nonlocal sent, status
        status = message.get("status", status)
        sent += len(message.get("body", b""))

    headers = [
        (b"host", b"127.0.0.1:8080"),
        (b"content-type", b"application/json"),
        (b"x-tokenwire-session", session.encode()),
    ]
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers,
             "query_string": b"", "http_version": "1.1", "scheme": "http", "root_path": "",
             "server": ("127.0.0.1", 8080), "client": ("127.0.0.1", 1),
             "extensions": {BODY_NOW: {"write": written}}}  # fmt: skip
    await app(scope, receive, send)
    if status != 200:
        raise RuntimeError(f"the gateway answered {status}")
    return sent


async def _run() -> float:
    deps = GatewayDeps(
        upstream=_Upstream(paced_reads(TOKENS)),  # type: ignore[arg-type]  # a stand-in with the two methods the step calls
        sink=_Sink(),  # type: ignore[arg-type]  # in-process sink: only publish, no broker
        steps=MemoryStepRegistry(),
        otel=no_otel(),
    )
    settings = GatewaySettings(provider_env={"TOKENWIRE_SCRIPTED_BASE_URL": "http://p.invalid"})
    app = create_app(settings, deps)
    body = msgspec.json.encode(
        {"model": "scripted/text", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    )
    assert await _request(app, body, "warm") > TOKENS
    best = float("inf")
    for r in range(REPEATS):
        started = time.process_time()
        for i in range(REQUESTS):
            await _request(app, body, f"s-{r}-{i}")
        best = min(best, (time.process_time() - started) / (REQUESTS * TOKENS) * 1e6)
    return best


def main() -> str:
    us = uvloop.run(_run())
    FIGURES["us_per_token"] = us
    return (
        "| gateway in process, memory seams, one event per read | CPU us per token (best of "
        f"{REPEATS}) |\n| --- | ---: |\n| {TOKENS} tokens x {REQUESTS} requests | {us:.2f} |"
    )


if __name__ == "__main__":
    print(main())
