"""Coalesced reads (``_steps/coalesce.py``, ADR 0032) on the real gateway: a real socket in front of
the scripted provider streaming at 50 tokens/s, publishing to a real nats-server.

Ground truth: the scripted provider's ``expected_outcome`` for the content, and the HTTP
chunked framing on the caller's socket for the gateway's writes (each write to the caller is
one chunk of the chunked body)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from nats.aio.client import Client

from tests.gateway._helpers import GATEWAY_KEY, provider_env
from tests.gateway.test_gateway_real import by_session, read_stream, sent_body
from tokenwire.broker import Topology
from tokenwire.fold import fold
from tokenwire.schemas import Message
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.services.scripted_provider import ScriptedServer, ScriptedSettings, expected_outcome

TOKENS = 30
PACED = ScriptedSettings(seed=5, length=TOKENS, token_rate=50)  # 0.6 s of tokens a step
AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
MESSAGES = [{"role": "user", "content": "hi"}]


@dataclass
class Rig:
    url: str
    port: int
    nc: Client
    topology: Topology


@contextlib.asynccontextmanager
async def _rig(nc: Client, topology: Topology, coalesce_ms: int = 0) -> AsyncIterator[Rig]:
    """The scripted provider at 50 tokens/s and a gateway in front of it (``coalesce_ms``:
    the deployment's default)."""
    async with ScriptedServer(PACED) as scripted:
        real = await broker_deps(nc, topology)
        settings = GatewaySettings(
            port=0,
            keys=frozenset({GATEWAY_KEY}),
            provider_env=provider_env(TOKENWIRE_SCRIPTED_BASE_URL=scripted.url),
            partitions=topology.partitions,
            ack_timeout_s=10.0,
            coalesce_ms=coalesce_ms,
        )
        try:
            async with GatewayServer(settings, real.deps) as server:
                port = int(server.url.rsplit(":", 1)[1])
                yield Rig(server.url, port, nc, topology)
        finally:
            await real.aclose()


@pytest.fixture
async def rig(nc: Client, topology: Topology) -> AsyncIterator[Rig]:
    async with _rig(nc, topology) as rig:
        yield rig


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    writes: list[bytes]
    """The body's chunks as the chunked encoding framed them: one per write to the caller."""

    @property
    def events(self) -> list[dict[str, Any]]:
        body = b"".join(self.writes).decode()
        datas = [line[6:] for line in body.split("\n") if line.startswith("data: ")]
        return [json.loads(d) for d in datas if d != "[DONE]"]

    @property
    def text(self) -> str:
        deltas = (c["delta"] for e in self.events for c in e["choices"])
        return "".join(d.get("content") or "" for d in deltas)


async def _post(port: int, session: str, extra: dict[str, str]) -> Answer:
    """One streamed chat completion on a raw socket: the status, headers and chunks."""
    body = json.dumps({"model": "scripted/text", "messages": MESSAGES, "stream": True}).encode()
    head = {
        **AUTH,
        **extra,
        "x-tokenwire-session": session,
        "host": "127.0.0.1",
        "content-type": "application/json",
        "content-length": str(len(body)),
    }
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\n")
        writer.write("".join(f"{k}: {v}\r\n" for k, v in head.items()).encode() + b"\r\n" + body)
        status_line = await reader.readline()
        headers: dict[str, str] = {}
        while (line := await reader.readline()) != b"\r\n":
            name, _, value = line.decode().partition(":")
            headers[name.strip().lower()] = value.strip()
        writes = await asyncio.wait_for(_chunks(reader, headers), timeout=30)
    finally:
        writer.close()
    return Answer(int(status_line.split()[1]), headers, writes)


async def _chunks(reader: asyncio.StreamReader, headers: dict[str, str]) -> list[bytes]:
    if headers.get("transfer-encoding") != "chunked":  # an error answer: one body
        return [await reader.readexactly(int(headers["content-length"]))]
    writes = []
    while size := int((await reader.readline()).strip(), 16):
        writes.append(await reader.readexactly(size))
        await reader.readexactly(2)  # the chunk's CRLF
    await reader.readexactly(2)  # the body's last CRLF
    return writes


def _expected_text(session: str) -> str:
    body = sent_body("openai", "text", MESSAGES)
    want = expected_outcome(
        "text", body, PACED, headers={"X-Tokenwire-Session": session}, dialect="openai"
    )
    return want.text


async def test_a_coalescing_caller_gets_the_same_stream_in_fewer_writes_and_the_log_is_whole(rig):
    plain = await _post(rig.port, "plain", {})
    coalesced = await _post(rig.port, "gathered", {"x-tokenwire-coalesce-ms": "250"})

    assert plain.status == coalesced.status == 200
    assert coalesced.headers["x-tokenwire-coalesce-ms"] == "250"  # the answer says so
    assert "x-tokenwire-coalesce-ms" not in plain.headers
    assert plain.text == _expected_text("plain")
    assert coalesced.text == _expected_text("gathered")
    # At 50 tokens/s, 30 tokens take 0.6 s: read every 250 ms they reach the caller in a few
    # writes (the first read's, a handful of gathered ones, the end); one write per token
    # read is what an uncoalesced caller may get. The bound below holds unless the provider
    # ran more than 3x slower than its pace.
    assert len(coalesced.writes) <= TOKENS // 2, len(coalesced.writes)

    # Every chunk is in the log once, in order, and folds to the provider's answer.
    sessions = by_session(await read_stream(rig.nc, rig.topology))
    for session in ("plain", "gathered"):
        envs = sessions[session]
        assert [e.ordinal for e in envs] == list(range(len(envs)))
        got = fold([e.chunk for e in envs])
        assert isinstance(got, Message)
        assert got.text == _expected_text(session)
    # The gathered chunks keep the order of their reads in time (nothing reordered).
    times = [e.time_ns for e in sessions["gathered"]]
    assert times == sorted(times)


async def test_the_deployments_default_applies_and_a_request_can_turn_it_off(nc, topology):
    async with _rig(nc, topology, coalesce_ms=200) as rig:
        default = await _post(rig.port, "by-default", {})
        off = await _post(rig.port, "turned-off", {"x-tokenwire-coalesce-ms": "0"})
    assert default.headers["x-tokenwire-coalesce-ms"] == "200"
    assert "x-tokenwire-coalesce-ms" not in off.headers
    assert default.text == _expected_text("by-default")
    assert off.text == _expected_text("turned-off")
    assert len(default.writes) <= TOKENS // 2, len(default.writes)


@pytest.mark.parametrize("value", ["1001", "-5", "soon", "1e2", "", "\u0661\u0660"])
async def test_a_malformed_coalesce_header_is_refused_before_the_provider_is_called(rig, value):
    answer = await _post(rig.port, "refused", {"x-tokenwire-coalesce-ms": value})
    assert answer.status == 400
    error = json.loads(answer.writes[0])["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "x-tokenwire-coalesce-ms"
    assert "0 to 1000" in error["message"]
    # nothing was published: no step began
    assert (await rig.nc.jetstream().stream_info(rig.topology.stream)).state.messages == 0


async def test_a_folded_answer_reports_the_coalescing_too(rig):
    async with httpx.AsyncClient(base_url=rig.url, timeout=30) as client:
        response = await client.post(
            "/v1/chat/completions",
            json={"model": "scripted/text", "messages": MESSAGES},
            headers={**AUTH, "x-tokenwire-session": "folded", "x-tokenwire-coalesce-ms": "100"},
        )
    assert response.status_code == 200
    assert response.headers["x-tokenwire-coalesce-ms"] == "100"
    assert response.json()["choices"][0]["message"]["content"] == _expected_text("folded")
