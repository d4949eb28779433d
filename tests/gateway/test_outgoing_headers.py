"""Every value that goes into a provider request's head either goes on the wire or is refused
where it came from: a configured credential or base URL when the gateway starts (a
``ConfigError`` naming the variable, never the secret), a caller's forwarded header with a
400 in the endpoint's dialect naming the header, before anything is claimed, sent or
published. Before, both were a bare 500 from the provider client's ``ValueError``.

The provider is a real loopback HTTP/1.1 server that records each request's head as it
arrived; the gateway runs on a real socket over a real nats-server, except where a header no
HTTP/1.1 parser lets through (a line break) must reach it: that takes the app in process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from nats.aio.client import Client

from tests.gateway._helpers import GATEWAY_KEY, OPENAI_KEY, recording
from tests.gateway.test_gateway_real import by_session, read_stream
from tests.gateway.test_sent_call_let_go import FULL
from tokenwire.broker import MemoryPublisher, MemoryStepRegistry, Topology
from tokenwire.config import ConfigError
from tokenwire.services.gateway import (
    GatewayDeps,
    GatewayServer,
    GatewaySettings,
    HttpUpstream,
    broker_deps,
    create_app,
)

AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
MESSAGES = [{"role": "user", "content": "x"}]


def _json(status: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}"
    return head.encode() + b"\r\n\r\n" + data


def _sse(body: bytes) -> bytes:
    head = f"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {len(body)}"
    return head.encode() + b"\r\n\r\n" + body


COUNTED = _json("200 OK", {"input_tokens": 3})
NOT_FOUND = _json("404 Not Found", {"error": {"code": 404, "message": "no such model"}})
ANTHROPIC_STREAM = _sse(recording("anthropic/messages-text-short.sse"))


class RecordingProvider:
    """Answers each request with ``answer(path)`` and keeps its head as it arrived."""

    def __init__(self, answer: Callable[[str], bytes]) -> None:
        self.answer = answer
        self.heads: list[bytes] = []
        self.url = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                await reader.readexactly(length)
                self.heads.append(head)
                writer.write(self.answer(head.split(b" ")[1].decode()))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def header(self, n: int, name: bytes) -> bytes | None:
        """The raw value of header ``name`` in request ``n``, as it arrived."""
        for line in self.heads[n].split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == name:
                return value.strip()
        return None


@contextlib.asynccontextmanager
async def recording_provider(answer: Callable[[str], bytes]) -> AsyncIterator[RecordingProvider]:
    provider = RecordingProvider(answer)
    server = await asyncio.start_server(provider.serve, "127.0.0.1", 0)
    provider.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield provider
    finally:
        server.close()


def _answer(path: str) -> bytes:
    if path.endswith("/count_tokens"):
        return COUNTED
    if path == "/v1/messages":
        return ANTHROPIC_STREAM
    return NOT_FOUND if path.startswith("/v1beta/") else FULL


def provider_env(provider: RecordingProvider) -> dict[str, str]:
    return {
        "OPENAI_API_KEY": OPENAI_KEY,
        "ANTHROPIC_API_KEY": "sk-ant-outgoing-1a2b3c",
        "GEMINI_API_KEY": "gemini-outgoing-4d5e6f",
        "TOKENWIRE_OPENAI_BASE_URL": provider.url + "/v1",
        "TOKENWIRE_ANTHROPIC_BASE_URL": provider.url,
        "TOKENWIRE_GEMINI_BASE_URL": provider.url,
    }


def gateway_settings(env: dict[str, str], topology: Topology | None = None) -> GatewaySettings:
    return GatewaySettings(
        port=0,
        keys=frozenset({GATEWAY_KEY}),
        provider_env=env,
        ack_timeout_s=10.0,
        partitions=topology.partitions if topology is not None else 16,
    )


# -- configuration: refused when the gateway starts --------------------------------------------

BAD_KEYS = {
    "a trailing line break (a key read from a file)": "sk-outgoing-SECRET-9z8y\n",
    "a header smuggled after a line break": "sk-outgoing-SECRET-9z8y\r\nx-evil: 1",
    "a NUL": "sk-outgoing-SECRET\x009z8y",
    "a control character": "sk-outgoing-SECRET\x019z8y",
    "a character outside latin-1 (a pasted ellipsis)": "sk-outgoing-SECRET\u20269z8y",
    "a leading space": " sk-outgoing-SECRET-9z8y",
}


@pytest.mark.parametrize("key", BAD_KEYS.values(), ids=BAD_KEYS.keys())
def test_a_provider_key_that_cannot_be_a_header_stops_the_start_naming_the_variable(
    key: str,
) -> None:
    """``tokenwire gateway`` reads its settings with ``from_env``: one line, exit 2."""
    with pytest.raises(ConfigError) as info:
        GatewaySettings.from_env({"ANTHROPIC_API_KEY": key})
    assert info.value.name == "ANTHROPIC_API_KEY"
    assert "SECRET" not in str(info.value)  # the key is never repeated
    assert "header" in info.value.why


BAD_URLS = {
    "a port that is not a number": "http://127.0.0.1:abc/v1",
    "a port out of range": "https://user:SECRET@api.example:99999/v1",
    "not http": "ftp://api.example/v1",
    "no host": "http:///v1",
    "a line break": "https://api.example/v1\n",
    "a host outside latin-1": "https://\u4f8b\u3048.example/v1",
}


@pytest.mark.parametrize("url", BAD_URLS.values(), ids=BAD_URLS.keys())
@pytest.mark.parametrize("variable", ["TOKENWIRE_OPENAI_BASE_URL", "TOKENWIRE_SCRIPTED_BASE_URL"])
def test_a_base_url_the_gateway_cannot_call_stops_the_start(variable: str, url: str) -> None:
    with pytest.raises(ConfigError) as info:
        GatewaySettings.from_env({variable: url})
    assert info.value.name == variable
    assert "SECRET" not in str(info.value)  # a URL's password is never repeated


BAD_PROXIES = {
    "an https:// proxy": "https://user:SECRET@proxy.example:3128",
    "a port that is not a number": "http://user:SECRET@proxy.example:abc",
    "no scheme, a bad port": "user:SECRET@proxy.example:abc",
    "no host": "http://",
}


@pytest.mark.parametrize("url", BAD_PROXIES.values(), ids=BAD_PROXIES.keys())
@pytest.mark.parametrize("variable", ["HTTPS_PROXY", "http_proxy"])
def test_a_proxy_the_client_cannot_use_stops_the_start(variable: str, url: str) -> None:
    """Every provider call through it would fail (an https:// proxy was a 500 on each)."""
    with pytest.raises(ConfigError) as info:
        GatewaySettings.from_env({variable: url})
    assert info.value.name == variable
    assert "http://[user:password@]host[:port]" in info.value.why
    assert "SECRET" not in str(info.value)  # a proxy's password is never repeated


def test_a_proxy_the_client_can_use_starts() -> None:
    for url in ("http://user:SECRET@proxy.example:3128", "proxy.example:3128"):
        GatewaySettings.from_env({"HTTPS_PROXY": url, "NO_PROXY": "127.0.0.1"})


async def test_settings_built_in_code_are_checked_when_the_server_is_built() -> None:
    """``GatewayServer`` (tests, ``tokenwire up``) and ``create_app`` take settings built
    without ``from_env``: the same check runs there, before anything listens."""
    deps = GatewayDeps(upstream=HttpUpstream(), sink=MemoryPublisher(), steps=MemoryStepRegistry())
    try:
        for env in ({"OPENAI_API_KEY": "sk-SECRET\n"}, {"TOKENWIRE_GEMINI_BASE_URL": "gemini"}):
            with pytest.raises(ConfigError) as info:
                GatewayServer(gateway_settings(env), deps)
            assert info.value.name in env
            assert "SECRET" not in str(info.value)
    finally:
        await deps.upstream.aclose()  # type: ignore[attr-defined]  # an HttpUpstream


def test_variables_no_provider_reads_are_not_checked() -> None:
    """``from_env`` keeps every ``*_API_KEY`` (to scrub them); only a provider's own
    credential goes into a header, so only those can stop the start."""
    settings = GatewaySettings.from_env({"OTHER_TOOL_API_KEY": "x\n", "OPENAI_API_KEY": "sk-ok"})
    assert settings.provider_env["OPENAI_API_KEY"] == "sk-ok"


# -- a caller's forwarded header ---------------------------------------------------------------


@pytest.fixture
async def provider() -> AsyncIterator[RecordingProvider]:
    async with recording_provider(_answer) as p:
        yield p


@pytest.fixture
async def gateway_url(
    provider: RecordingProvider, nc: Client, topology: Topology
) -> AsyncIterator[str]:
    """A real gateway on a socket over a real nats-server, in front of ``provider``."""
    real = await broker_deps(nc, topology)
    try:
        async with GatewayServer(
            gateway_settings(provider_env(provider), topology), real.deps
        ) as s:
            yield s.url
    finally:
        await real.aclose()


async def test_count_tokens_forwards_a_non_ascii_header_as_the_model_endpoints_do(
    provider: RecordingProvider, gateway_url: str
) -> None:
    """An ``anthropic-beta`` holding a latin-1 byte (obs-text, which HTTP allows and the
    parser hands over) was a 500 on ``/v1/messages/count_tokens`` (httpx encodes ``str``
    header values as ASCII); ``/v1/messages`` forwarded it as it came. Both now do."""
    beta = {b"anthropic-beta": b"caf\xe9-2025"}
    async with httpx.AsyncClient(base_url=gateway_url, headers=AUTH, timeout=30) as client:
        counted = await client.post(
            "/v1/messages/count_tokens",
            json={"model": "anthropic/claude-x", "messages": MESSAGES},
            headers=beta,
        )
        streamed = await client.post(
            "/v1/chat/completions",
            json={"model": "openai/gpt-4o", "stream": True, "messages": MESSAGES},
            headers={b"openai-organization": b"caf\xe9-2025"},
        )
    assert (counted.status_code, counted.json()) == (200, {"input_tokens": 3})
    assert streamed.status_code == 200, streamed.text
    assert provider.header(0, b"anthropic-beta") == b"caf\xe9-2025"
    assert provider.header(1, b"openai-organization") == b"caf\xe9-2025"


async def test_a_gemini_model_name_stays_one_path_segment(
    provider: RecordingProvider, gateway_url: str
) -> None:
    """Gemini puts the model in the URL path: ``#``, ``?`` or ``/`` in it re-aimed the
    gateway's credential at another path of the provider (``a#b`` cut the method and
    ``alt=sse`` off). It is percent-encoded as the one segment it is."""
    body = {"model": "gemini/a#b?c/../d", "stream": True, "messages": MESSAGES}
    async with httpx.AsyncClient(base_url=gateway_url, headers=AUTH, timeout=30) as client:
        answer = await client.post("/v1/chat/completions", json=body)
    assert answer.status_code == 404, answer.text  # the provider's answer, relayed
    target = provider.heads[0].split(b" ")[1]
    assert target == b"/v1beta/models/a%23b%3Fc%2F..%2Fd:streamGenerateContent?alt=sse"


CALLER_HEADERS = [
    ("/v1/chat/completions", "openai/gpt-4o", "openai-organization"),
    ("/v1/responses", "openai/gpt-4o", "openai-project"),
    ("/v1/messages", "anthropic/claude-x", "anthropic-beta"),
]


def _body(path: str, model: str) -> dict[str, Any]:
    if path == "/v1/responses":
        return {"model": model, "stream": True, "input": "x"}
    return {"model": model, "stream": True, "max_tokens": 10, "messages": MESSAGES}


def _refusal(path: str, answer: httpx.Response) -> tuple[str, str | None]:
    """The error's type and the header it names (OpenAI's ``param``, else in the message)."""
    body = answer.json()
    error = body["error"]
    if path == "/v1/messages":
        assert body["type"] == "error"
        return error["type"], next((h for _, _, h in CALLER_HEADERS if h in error["message"]), None)
    return error["type"], error["param"]


@pytest.mark.parametrize(("path", "model", "header"), CALLER_HEADERS)
async def test_a_forwarded_header_with_a_line_break_is_400_before_the_claim(
    path: str, model: str, header: str, provider: RecordingProvider, nc: Client, topology: Topology
) -> None:
    """A line break in a forwarded header cannot go on to the provider. No HTTP/1.1 parser
    hands one to the app (uvicorn refuses the request), but an app hosted otherwise gets
    what it is given: the answer is the endpoint's 400 naming the header, and the triple is
    not claimed (the same triple with a good header then runs), nothing was published or
    sent to the provider."""
    real = await broker_deps(nc, topology)
    app = create_app(gateway_settings(provider_env(provider), topology), real.deps)
    session = f"crlf-{header}"
    triple = {**AUTH, "x-tokenwire-session": session, "x-tokenwire-turn": "0"}
    triple["x-tokenwire-step"] = "0"
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
            bad = {**triple, header: "v1\r\nx-evil: 1"}
            refused = await client.post(path, json=_body(path, model), headers=bad)
            assert refused.status_code == 400, refused.text
            assert refused.headers["x-should-retry"] == "false"
            assert _refusal(path, refused) == ("invalid_request_error", header)
            assert header in refused.json()["error"]["message"]
            assert provider.heads == []
            assert session not in by_session(await read_stream(nc, topology))
            good = await client.post(
                path, json=_body(path, model), headers={**triple, header: "v1"}
            )
    finally:
        await real.aclose()
    assert good.status_code == 200, good.text
    assert provider.header(0, header.encode()) == b"v1"


async def test_count_tokens_refuses_a_forwarded_header_with_a_line_break_in_its_dialect(
    provider: RecordingProvider,
) -> None:
    deps = GatewayDeps(upstream=HttpUpstream(), sink=MemoryPublisher(), steps=MemoryStepRegistry())
    app = create_app(gateway_settings(provider_env(provider)), deps)
    body = {"model": "anthropic/claude-x", "messages": MESSAGES}
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
        ) as client:
            answer = await client.post(
                "/v1/messages/count_tokens", json=body, headers={**AUTH, "anthropic-beta": "a\nb"}
            )
    finally:
        await deps.upstream.aclose()  # type: ignore[attr-defined]  # an HttpUpstream
    assert answer.status_code == 400, answer.text
    assert answer.json()["type"] == "error"
    assert "anthropic-beta" in answer.json()["error"]["message"]
    assert provider.heads == []
