"""The gateway calls the provider before it sets the step up (docs/gateway-internals.md,
"Performance"):
every sent call is read or let go, whatever ends the request between the send and the read, and
what a caller sees of a claim conflict or a provider failure is what it was before the change.

The provider is a real loopback HTTP/1.1 server (:class:`LoopbackProvider`): it counts
connections and requests and notes each connection the gateway closed, which is how a call let
go shows (an unread call left open would keep its connection, and the provider streaming into
it). The gateway runs over the real ``HttpUpstream``; the broker is a real nats-server where
the test claims what the broker records, its in-memory twins where a fault is injected into it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from nats.aio.client import Client

from tests.gateway._helpers import GATEWAY_KEY, OPENAI_KEY
from tests.gateway.test_gateway_real import by_session, read_stream
from tokenwire.broker import (
    BrokerUnavailable,
    MemoryPublisher,
    MemoryStepRegistry,
    PendingAssignment,
    StepAllocator,
    Topology,
)
from tokenwire.schemas import Finish
from tokenwire.services.gateway import (
    GatewayDeps,
    GatewayServer,
    GatewaySettings,
    HttpUpstream,
    broker_deps,
    create_app,
)
from tokenwire.services.gateway._api import app as gateway_app

AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
BODY = {"model": "openai/gpt-4o", "stream": True, "messages": [{"role": "user", "content": "x"}]}
PATH = "/v1/chat/completions"


def _event(delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    chunk = {"id": "c1", "object": "chat.completion.chunk", "model": "gpt-4o", "choices": [choice]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


FIRST_EVENT = _event({"role": "assistant", "content": "hi"})
SSE = FIRST_EVENT + _event({}, "stop") + b"data: [DONE]\n\n"
FULL = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
    + f"content-length: {len(SSE)}\r\n\r\n".encode()
    + SSE
)
"""A whole streamed answer on a keep-alive connection."""
RATE_LIMITED_BODY = json.dumps(
    {"error": {"message": "slow down", "type": "requests", "code": "rate_limit_exceeded"}}
).encode()
RATE_LIMITED = (
    b"HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\nretry-after: 7\r\n"
    + f"content-length: {len(RATE_LIMITED_BODY)}\r\n\r\n".encode()
    + RATE_LIMITED_BODY
)


@dataclass(frozen=True)
class Held:
    """``prefix`` is written, then nothing more: the answer is held until the gateway closes
    the connection (a provider still working, or streaming slowly)."""

    prefix: bytes


SILENT = Held(b"")
STREAMING = Held(
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    + f"{len(FIRST_EVENT):x}\r\n".encode()
    + FIRST_EVENT
    + b"\r\n"
)
"""The headers and the first event of a stream that does not go on."""

Answer = bytes | Held


class Signal:
    """Something that changes; :meth:`until` waits (bounded) for a condition on it."""

    def __init__(self) -> None:
        self._changed = asyncio.Event()

    def note(self) -> None:
        self._changed.set()

    async def until(self, what: Callable[[], bool], timeout_s: float = 10.0) -> None:
        async with asyncio.timeout(timeout_s):
            while not what():
                self._changed.clear()
                await self._changed.wait()


class LoopbackProvider(Signal):
    """Request ``n`` (from 0, over every connection) is answered with ``plan(n)``."""

    def __init__(self, plan: Callable[[int], Answer]) -> None:
        super().__init__()
        self.plan = plan
        self.connections = 0
        self.requests = 0
        self.ended = 0  # connections the gateway closed
        self.url = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.note()
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                answer = self.plan(self.requests)
                self.requests += 1
                self.note()
                writer.write(answer.prefix if isinstance(answer, Held) else answer)
                await writer.drain()
                if isinstance(answer, Held):
                    await reader.read()  # b"" once the gateway closed the connection
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.ended += 1
            self.note()
            writer.close()

    def all_closed(self) -> bool:
        return self.ended == self.connections


@contextlib.asynccontextmanager
async def loopback_provider(plan: Callable[[int], Answer]) -> AsyncIterator[LoopbackProvider]:
    provider = LoopbackProvider(plan)
    server = await asyncio.start_server(provider.serve, "127.0.0.1", 0)
    provider.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    try:
        yield provider
    finally:
        server.close()


def settings(
    provider: LoopbackProvider, more_env: dict[str, str] | None = None, **extra: Any
) -> GatewaySettings:
    env = {"OPENAI_API_KEY": OPENAI_KEY, "TOKENWIRE_OPENAI_BASE_URL": provider.url}
    env |= more_env or {}
    return GatewaySettings(keys=frozenset({GATEWAY_KEY}), provider_env=env, **extra)


@dataclass
class Local:
    """The gateway in process, over the real ``HttpUpstream``."""

    client: httpx.AsyncClient
    sink: MemoryPublisher
    gateway: gateway_app.Gateway

    def in_flight(self) -> float | None:
        """The steps-reading-a-provider gauge (0 once every step ended)."""
        registry = self.gateway.metrics.registry
        return registry.get_sample_value("tokenwire_gateway_streams_in_flight")

    def finishes(self) -> list[Finish]:
        return [m.envelope.chunk for m in self.sink.messages if type(m.envelope.chunk) is Finish]


@contextlib.asynccontextmanager
async def local_gateway(
    provider: LoopbackProvider,
    *,
    sink: MemoryPublisher | None = None,
    steps: StepAllocator | None = None,
) -> AsyncIterator[Local]:
    """The app on the real upstream; closes its pooled connections, then waits (bounded) for
    the provider to see every connection closed."""
    upstream = HttpUpstream()
    sink = sink or MemoryPublisher()
    deps = GatewayDeps(upstream=upstream, sink=sink, steps=steps or MemoryStepRegistry())
    app = create_app(settings(provider, ack_timeout_s=5.0), deps)
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            yield Local(client, sink, app.state.gateway)
    finally:
        await upstream.aclose()
    await provider.until(provider.all_closed)


def triple(session: str, turn: int, step: int) -> dict[str, str]:
    return {
        **AUTH,
        "x-tokenwire-session": session,
        "x-tokenwire-turn": str(turn),
        "x-tokenwire-step": str(step),
    }


def warm_then(answer: Answer) -> Callable[[int], Answer]:
    """A whole answer to the first request (:func:`pool_a_connection`), then ``answer``."""
    return lambda n: FULL if n == 0 else answer


async def pool_a_connection(local: Local, provider: LoopbackProvider) -> None:
    """One whole answer (an explicit triple: no assignment): its connection stays pooled, and
    the next call is written on it at once."""
    response = await local.client.post(PATH, json=BODY, headers=triple("warm", 0, 0))
    assert response.status_code == 200, response.text
    assert (provider.connections, provider.requests, provider.ended) == (1, 1, 0)


# -- the explicit claim is made before the provider is called ---------------------------------


async def test_a_repeated_explicit_triple_is_409_without_a_provider_call(
    nc: Client, topology: Topology
) -> None:
    """docs/gateway.md: a triple claimed before by another request is refused with 409, and
    the same request again resumes it: no provider call spent either way. Each repeat finds a
    pooled connection, so a call sent before its claim would reach the provider at once; the
    provider's count is read once every connection ended."""
    async with loopback_provider(lambda n: FULL) as provider:
        real = await broker_deps(nc, topology)
        try:
            async with (
                GatewayServer(settings(provider, port=0), real.deps) as server,
                httpx.AsyncClient(base_url=server.url, timeout=30) as client,
            ):
                other = {**BODY, "temperature": 0.5}
                answers = [
                    await client.post(PATH, json=body, headers=triple("dup", 0, step))
                    for body, step in ((BODY, 0), (other, 0), (BODY, 0), (BODY, 1))
                ]
        finally:
            await real.aclose()
        await provider.until(provider.all_closed)
    assert [a.status_code for a in answers] == [200, 409, 200, 200]
    assert answers[1].headers["x-should-retry"] == "false"
    assert answers[2].headers["x-tokenwire-resumed"] == "true"
    assert provider.requests == 2
    steps = [(e.turn, e.step) for e in by_session(await read_stream(nc, topology))["dup"]]
    assert sorted(set(steps)) == [(0, 0), (0, 1)]


# -- a provider failure answers and is recorded as before ------------------------------------


async def test_a_provider_error_on_an_early_sent_call_is_recorded_and_relayed(
    nc: Client, topology: Topology
) -> None:
    """A 429 answering a call written at once on a pooled connection, and a refused connection:
    each is the step's one recorded ``finish {error}`` and the dialect's error, as before."""
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        refused = probe.getsockname()[1]
    async with loopback_provider(lambda n: FULL if n == 0 else RATE_LIMITED) as provider:
        real = await broker_deps(nc, topology)
        dead = {
            "TOKENWIRE_DEEPSEEK_BASE_URL": f"http://127.0.0.1:{refused}/v1",
            "DEEPSEEK_API_KEY": "sk-deepseek-review",
        }
        try:
            async with (
                GatewayServer(settings(provider, dead, port=0), real.deps) as server,
                httpx.AsyncClient(base_url=server.url, timeout=30) as client,
            ):

                async def post(session: str, model: str = "openai/gpt-4o") -> httpx.Response:
                    headers = {**AUTH, "x-tokenwire-session": session}
                    return await client.post(PATH, json={**BODY, "model": model}, headers=headers)

                ok, limited = await post("ok"), await post("limited")
                gone = await post("gone", "deepseek/chat")
        finally:
            await real.aclose()
        await provider.until(provider.all_closed)
    assert (ok.status_code, limited.status_code, gone.status_code) == (200, 429, 502)
    assert provider.connections == 1  # the 429 came on the pooled connection
    assert limited.headers["retry-after"] == "7"
    assert "slow down" in limited.json()["error"]["message"]
    sessions = by_session(await read_stream(nc, topology))
    for session, code in (("limited", "rate_limit_exceeded"), ("gone", "connect_error")):
        [only] = sessions[session]
        assert isinstance(only.chunk, Finish)
        assert only.chunk.error is not None
        assert (only.ordinal, only.chunk.reason, only.chunk.error.code) == (0, "error", code)


# -- every sent call is read or let go ---------------------------------------------------------


async def test_a_set_up_failing_after_the_send_closes_the_pooled_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The call went out on the pooled connection; the span's set-up raises: the connection is
    closed (never pooled again with an unread answer on it), the next call opens a new one."""

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("set-up failed")

    async with loopback_provider(lambda n: FULL) as provider, local_gateway(provider) as local:
        await pool_a_connection(local, provider)
        with monkeypatch.context() as patch:
            patch.setattr(gateway_app, "start_step_span", broken)
            with pytest.raises(RuntimeError, match="set-up failed"):
                await local.client.post(PATH, json=BODY, headers=AUTH)
        await provider.until(lambda: provider.ended == 1)
        assert provider.requests == 2  # it was sent, then let go
        response = await local.client.post(PATH, json=BODY, headers=AUTH)
        assert response.status_code == 200
        assert (provider.connections, provider.requests) == (2, 3)


class Assignments(MemoryStepRegistry):
    """Explicit claims as the in-memory twin; every assignment is sent and answered by
    ``pending`` (a fault of the registry between the send and the answer)."""

    def __init__(self, pending: PendingAssignment) -> None:
        super().__init__()
        self._pending = pending

    async def begin_next_step(  # type: ignore[override]  # answered by the injected fault
        self, session: str, new_turn: bool, fingerprint: str = "", *, fresh: bool = False
    ) -> PendingAssignment:
        return self._pending


class Refused:
    """The registry went away: the answer is a failure."""

    async def result(self) -> tuple[int, int]:
        raise BrokerUnavailable("memory://", "the registry went away")

    def drop(self) -> None:
        pass


class Unanswered(Signal):
    """No answer: only a cancellation ends the wait; ``waiting`` counts the waits."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = 0

    async def result(self) -> tuple[int, int]:
        self.waiting += 1
        self.note()
        await asyncio.Event().wait()
        raise AssertionError("never answered")

    def drop(self) -> None:
        pass


async def test_a_registry_failure_after_the_send_is_503_and_lets_the_stream_go() -> None:
    async with (
        loopback_provider(warm_then(STREAMING)) as provider,
        local_gateway(provider, steps=Assignments(Refused())) as local,
    ):
        await pool_a_connection(local, provider)
        response = await local.client.post(PATH, json=BODY, headers=AUTH)
        assert response.status_code == 503, response.text
        assert response.json()["error"]["message"].startswith("the step registry")
        await provider.until(lambda: provider.ended == 1)  # the held stream was let go
        assert provider.requests == 2
        assert local.in_flight() == 0
        assert {m.envelope.session for m in local.sink.messages} == {"warm"}  # nothing else


async def cancel_when(
    local: Local, headers: dict[str, str], signal: Signal, ready: Callable[[], bool]
) -> BaseException | None:
    """Post in a task, cancel it once ``ready()``; what the request ended with."""
    task = asyncio.create_task(local.client.post(PATH, json=BODY, headers=headers))
    await signal.until(ready)
    task.cancel()
    async with asyncio.timeout(10):
        await asyncio.wait({task})
    return asyncio.CancelledError() if task.cancelled() else task.exception()


async def test_a_request_cancelled_while_the_provider_is_silent_records_aborted() -> None:
    """Cancelled while it waits for the answer's headers on the early-sent call: the step is
    recorded ``aborted`` and the connection closed."""
    async with (
        loopback_provider(warm_then(SILENT)) as provider,
        local_gateway(provider) as local,
    ):
        await pool_a_connection(local, provider)
        headers = triple("quiet", 0, 0)
        ended = await cancel_when(local, headers, provider, lambda: provider.requests == 2)
        assert isinstance(ended, asyncio.CancelledError), repr(ended)
        await provider.until(lambda: provider.ended == 1)
        assert [f.reason for f in local.finishes()] == ["stop", "aborted"]
        assert local.in_flight() == 0


async def test_a_request_cancelled_while_its_step_waits_for_the_claim_lets_the_call_go() -> None:
    """The first chunk is read and waits for the assigned claim; the request is cancelled
    there. The step cannot record ``aborted`` (it has no identity) but must still end: the
    cancellation goes on as one (it was an AssertionError from ``StepClaim.identity``) and
    the provider's stream is let go (it was left open, the step never ended)."""
    unanswered = Unanswered()
    async with (
        loopback_provider(warm_then(STREAMING)) as provider,
        local_gateway(provider, steps=Assignments(unanswered)) as local,
    ):
        await pool_a_connection(local, provider)
        ended = await cancel_when(local, AUTH, unanswered, lambda: unanswered.waiting == 1)
        assert isinstance(ended, asyncio.CancelledError), repr(ended)
        await provider.until(lambda: provider.ended == 1)
        assert local.in_flight() == 0


class StalledPublisher(MemoryPublisher, Signal):
    """Once ``stalled``, every publish waits for ever (a publish window that never drains);
    ``waiting`` counts the waits."""

    def __init__(self) -> None:
        MemoryPublisher.__init__(self)
        Signal.__init__(self)
        self.stalled = False
        self.waiting = 0

    async def publish(self, envelope_bytes: bytes, *args: Any, **kwargs: Any) -> None:
        if not self.stalled:
            await super().publish(envelope_bytes, *args, **kwargs)
            return
        self.waiting += 1
        self.note()
        await asyncio.Event().wait()


async def test_a_step_cancelled_again_while_it_records_aborted_still_lets_the_call_go() -> None:
    """Cancelled as it publishes its first chunk, the step records ``aborted`` (which waits for
    the broker too); cancelled again there, it must still end and let the provider go (it
    skipped its end: the stream stayed open and the in-flight gauge up)."""
    sink = StalledPublisher()
    async with (
        loopback_provider(warm_then(STREAMING)) as provider,
        local_gateway(provider, sink=sink) as local,
    ):
        await pool_a_connection(local, provider)
        sink.stalled = True
        headers = triple("twice", 0, 0)
        task = asyncio.create_task(local.client.post(PATH, json=BODY, headers=headers))
        for waits in (1, 2):  # the first chunk's publish, then the aborted finish's
            await sink.until(lambda: sink.waiting == waits)  # noqa: B023 - called in this turn
            task.cancel()
        async with asyncio.timeout(10):
            await asyncio.wait({task})
        assert task.cancelled()
        await provider.until(lambda: provider.ended == 1)
        assert local.in_flight() == 0
