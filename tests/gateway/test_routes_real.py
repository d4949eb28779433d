"""Done-when of the routes (docs/gateway.md, "Routes"): two deployments behind one public name,
one of them refusing connections, then answering 500s in turn, then 429 with ``retry-after:
15``; 200 callers per phase see no error; every step's stored record names the deployment that
served it; after the first 429 neither gateway sends that deployment anything until the
cooldown ends (both kept sending callers through the whole 15 s), then one request probes it
and no other reaches it until the probe is answered, counted where the stand-in deployment
receives requests.

Real parts: two ``tokenwire gateway`` processes on their own sockets (each its routes file),
one nats-server (the shared cooldowns bucket), the scripted provider and a stand-in deployment
on sockets, the official openai SDK as every caller (``max_retries=0``: an error would reach
the test, never a silent SDK retry), the assembler in burst mode into SQLite. Oracles: the
scripted provider's script (``expected_outcome``) and the recording the stand-in answers with,
read through the openai SDK; which deployment served a caller is checked against what the
caller received.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from tests.fixtures.broker import close_client
from tests.gateway._helpers import (
    GATEWAY_KEY,
    collect_openai,
    openai_oracle,
    recording,
    stored_by_burst,
)
from tests.gateway.test_gateways_share_sessions import until_ready
from tokenwire.broker import EmbeddedServer, Topology, connect, ensure_topology, free_port
from tokenwire.schemas import MessageEvent, Routed
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.services.gateway._routing.routes_file import parse_routes
from tokenwire.services.scripted_provider import ScriptedServer, ScriptedSettings, expected_outcome
from tokenwire.store import open_store

pytestmark = pytest.mark.slow

SCRIPTED = ScriptedSettings(seed=45, length=6)
CALLERS = 200
AT_ONCE = 20
RETRY_AFTER_S = 15
"""The stand-in's ``retry-after``: the cooldown both gateways must keep. Long beside what it
takes the second gateway to learn it (tens of ms) and the 200 callers that follow it (a few
seconds); every second of it is ~40 more callers of steady load (30 s before issue 44)."""
PROBE_ANSWER_S = 2.0
"""How long the stand-in holds its answer to the probe (``slow``): the time in which a second
request would be a stampede."""
RECORDED = "openai/chat-text-include-usage.sse"
MESSAGES: Any = [{"role": "user", "content": "hi"}]


class StandIn:
    """The flaky deployment: one ASGI app on one socket per gateway (so what each gateway
    sent is counted apart), answering by ``mode``: ``alternate`` (500, then the recording, in
    turn), ``429`` (always, ``retry-after: 15``), ``500`` (always) or ``slow`` (the recording,
    after ``PROBE_ANSWER_S``)."""

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.mode = "alternate"
        self.served = 0
        self.answers: list[tuple[int, float, int]] = []  # (port, monotonic, status)

    def count(self, status: int, port: int | None = None) -> int:
        return sum(1 for p, _, s in self.answers if s == status and port in (None, p))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        while (await receive()).get("more_body"):
            pass
        status = self._status()
        self.answers.append((scope["server"][1], time.monotonic(), status))
        if self.mode == "slow":
            await asyncio.sleep(PROBE_ANSWER_S)
        if status == 200:
            headers = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": self.body})
            return
        body = (
            b'{"error":{"message":"stand-in says %d","type":"server_error","code":null}}' % status
        )
        headers = [(b"content-type", b"application/json")]
        if status == 429:
            headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _status(self) -> int:
        if self.mode in ("429", "500"):
            return int(self.mode)
        if self.mode == "slow":
            return 200
        self.served += 1
        return 500 if self.served % 2 else 200


@contextlib.asynccontextmanager
async def serving(app: StandIn, ports: list[int]) -> AsyncIterator[None]:
    """``app`` on every port (connections to them are refused before and after)."""
    sockets = []
    for port in ports:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sockets.append(sock)
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=sockets))
    try:
        async with asyncio.timeout(30):
            while not server.started:  # noqa: ASYNC110 - uvicorn's flag, no event to wait on
                await asyncio.sleep(0.01)
        yield
    finally:
        server.should_exit = True
        await task
        for sock in sockets:
            sock.close()


def routes_file(path: Path, scripted_url: str, west_port: int) -> Path:
    path.write_text(f"""
[defaults]
failures = 2
window_s = 30
cooldown_s = 1
max_cooldown_s = 60
first_byte_timeout_s = 20

[[models]]
name = "gpt-4o"
  [[models.deployments]]
  name = "east"
  provider = "openai"
  model = "text"
  base_url = "{scripted_url}/v1"
  api_key_env = "EAST_KEY"
  [[models.deployments]]
  name = "west"
  provider = "openai"
  model = "gpt-4o"
  base_url = "http://127.0.0.1:{west_port}/v1"
  api_key_env = "WEST_KEY"
""")
    return path


@contextlib.contextmanager
def gateway_processes(nats_url: str, routes: list[Path], tmp: Path) -> Iterator[list[str]]:
    """One ``tokenwire gateway`` process per routes file; yields their base URLs."""
    procs: list[subprocess.Popen[bytes]] = []
    urls = []
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOKENWIRE_")}
    try:
        for i, path in enumerate(routes):
            port = free_port()
            env = base | {
                "TOKENWIRE_NATS_URL": nats_url,
                "TOKENWIRE_PROVISION": "0",
                "TOKENWIRE_GATEWAY_KEYS": GATEWAY_KEY,
                "TOKENWIRE_GATEWAY_ADDR": f"127.0.0.1:{port}",
                "TOKENWIRE_DATA_DIR": str(tmp / f"data{i}"),
                "TOKENWIRE_ROUTES_FILE": str(path),
                "EAST_KEY": "sk-east-SENTINEL-000111",
                "WEST_KEY": "sk-west-SENTINEL-222333",
            }
            with (tmp / f"gateway{i}.log").open("wb") as out:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "tokenwire", "gateway"],
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
            urls.append(f"http://127.0.0.1:{port}")
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


async def callers(
    urls: list[str], phase: str, count: int = CALLERS
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """``count`` openai SDK callers, round-robin over the gateways, ``AT_ONCE`` at a time,
    each its own session; (what each received, by session), and the errors any saw."""
    gate = asyncio.Semaphore(AT_ONCE)
    got: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    clients = [
        openai.AsyncOpenAI(base_url=f"{u}/v1", api_key=GATEWAY_KEY, max_retries=0) for u in urls
    ]

    async def one(i: int) -> None:
        session = f"{phase}-{i}"
        async with gate:
            try:
                stream = await clients[i % len(clients)].chat.completions.create(
                    model="gpt-4o",
                    messages=MESSAGES,
                    stream=True,
                    extra_headers={"X-Tokenwire-Session": session},
                )
                got[session] = await collect_openai(stream)
            except openai.OpenAIError as exc:
                errors.append(f"{session}: {exc!r}")

    try:
        await asyncio.gather(*(one(i) for i in range(count)))
    finally:
        for client in clients:
            await client.close()
    return got, errors


async def steady(
    urls: list[str], phase: str, until_s: float, switch: tuple[float, Any]
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Callers through every gateway, ``len(urls) * 2`` every 0.1 s, until ``until_s``
    (monotonic); ``switch``: (when, what) is done once on the way."""
    got: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    rounds: list[asyncio.Task[tuple[dict[str, dict[str, Any]], list[str]]]] = []
    n = 0
    when, what = switch
    while time.monotonic() < until_s:
        if what is not None and time.monotonic() >= when:
            what()
            what = None
        rounds.append(asyncio.create_task(callers(urls, f"{phase}{n}", 2 * len(urls))))
        n += 1
        await asyncio.sleep(0.1)
    for done in await asyncio.gather(*rounds):
        got, errors = got | done[0], errors + done[1]
    return got, errors


async def deployment_state(client: httpx.AsyncClient, url: str, name: str) -> str | None:
    """The state the gateway at ``url`` reports for deployment ``name`` (its /metrics)."""
    text = (await client.get(f"{url}/metrics")).text
    pattern = (
        rf'tokenwire_gateway_deployment_state\{{deployment="{name}",state="(\w[\w-]*)"\}} 1\.0'
    )
    found = re.search(pattern, text)
    return found.group(1) if found else None


async def until(test: Any, timeout_s: float = 60.0) -> None:
    """Wait (bounded) until ``await test()`` holds."""
    async with asyncio.timeout(timeout_s):
        while not await test():  # noqa: ASYNC110 - polling another process's metrics
            await asyncio.sleep(0.02)


@pytest.fixture(scope="module")
def broker_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = EmbeddedServer(tmp_path_factory.mktemp("routes-nats"))
    server.start()
    try:
        yield server.url
    finally:
        server.stop()


async def test_two_deployments_three_failures_no_caller_error(
    broker_url: str, tmp_path: Path
) -> None:
    nc = await connect(broker_url)
    try:
        await ensure_topology(nc, Topology())
    finally:
        await close_client(nc)
    body = recording(RECORDED)
    stand_in = StandIn(body)
    ports = [free_port(), free_port()]
    async with ScriptedServer(SCRIPTED) as scripted:
        files = [
            routes_file(tmp_path / f"routes{i}.toml", scripted.url, p) for i, p in enumerate(ports)
        ]
        with gateway_processes(broker_url, files, tmp_path) as urls:
            async with httpx.AsyncClient(timeout=10) as client:
                for url in urls:
                    await until_ready(client, url)
                report = await _phases(urls, ports, stand_in, client)
    await _records_name_the_deployment(broker_url, tmp_path, report, body, stand_in)
    print(report["figures"])


async def _phases(
    urls: list[str], ports: list[int], stand_in: StandIn, client: httpx.AsyncClient
) -> dict[str, Any]:
    received: dict[str, dict[str, Any]] = {}
    # 1. refused connections: the stand-in is not listening yet
    got, errors = await callers(urls, "refused")
    assert errors == []
    received |= got
    async with serving(stand_in, ports):
        # 2. 500s and answers in turn (the callers go on, a few at a time and bounded, until
        # the stand-in answered both ways: a fast run may be over within one cooldown)
        got, errors = await callers(urls, "five")
        for more in range(50):
            if stand_in.count(500) and stand_in.count(200):
                break
            extra, late = await callers(urls, f"five{more}", AT_ONCE)
            got, errors = got | extra, errors + late
        assert errors == []
        received |= got
        assert stand_in.count(500) > 0
        assert stand_in.count(200) > 0
        # 3. 429 with retry-after: 15, sent through the first gateway only
        stand_in.mode = "429"
        first, second = urls
        solo = openai.AsyncOpenAI(base_url=f"{first}/v1", api_key=GATEWAY_KEY, max_retries=0)
        n = 0
        while stand_in.count(429) == 0:
            session = f"drive-{n}"
            stream = await solo.chat.completions.create(
                model="gpt-4o",
                messages=MESSAGES,
                stream=True,
                extra_headers={"X-Tokenwire-Session": session},
            )
            received[session] = await collect_openai(stream)
            n += 1
            assert n < 500, "the stand-in never got a request"
        await solo.close()
        [(port_429, at_429, _)] = [a for a in stand_in.answers if a[2] == 429]
        assert port_429 == ports[0]
        await until(lambda: _cooling(client, second))  # the second gateway learns the cooldown
        learned_s = time.monotonic() - at_429
        got, errors = await callers(urls, "limited")
        assert errors == []
        received |= got
        # callers go on through both gateways past the cooldown's end; the stand-in answers
        # slowly from shortly before it (the probe holds the deployment that long)
        ends = at_429 + RETRY_AFTER_S
        slow = (ends - 2, lambda: setattr(stand_in, "mode", "slow"))
        got, errors = await steady(urls, "steady", ends + 3 * PROBE_ANSWER_S, slow)
        assert errors == []
        received |= got
        window = [a for a in stand_in.answers if at_429 < a[1] < ends]
        assert [a for a in window if a[0] == ports[1]] == []  # the second gateway: nothing
        assert [a for a in window if a[0] == ports[0]] == []  # nor the first, after its 429
        after = [a for a in stand_in.answers if a[1] >= ends]
        assert after, "nobody probed the deployment after its cooldown"
        probe_at = after[0][1]
        during_probe = [a for a in after if a[1] < probe_at + PROBE_ANSWER_S]
        assert len(during_probe) == 1  # one probe, no stampede
        probe_after_s = probe_at - ends
        back = len(after) - 1  # requests after the probe was answered: back in service
    figures = {
        "callers": len(received),
        "stand_in_500": stand_in.count(500),
        "stand_in_200": stand_in.count(200),
        "stand_in_429": stand_in.count(429),
        "second_gateway_learned_s": round(learned_s, 3),
        "drive_requests": n,
        "probe_after_cooldown_end_s": round(probe_after_s, 3),
        "sent_to_it_after_the_probe": back,
    }
    return {"received": received, "figures": figures}


async def _cooling(client: httpx.AsyncClient, url: str) -> bool:
    return await deployment_state(client, url, "west") == "cooling"


async def _records_name_the_deployment(
    broker_url: str, tmp: Path, report: dict[str, Any], body: bytes, stand_in: StandIn
) -> None:
    """Every caller's step is stored with the deployment that served it: the caller received
    that deployment's content, and as many steps name the stand-in as it answered 200."""
    store_url = await stored_by_burst(broker_url, tmp)
    recorded = (await openai_oracle(body))["text"]
    scripted = expected_outcome("text", {"model": "text", "messages": MESSAGES}, SCRIPTED)
    assert scripted.message is not None
    east_text = "".join(b.text for b in scripted.message.content if hasattr(b, "text"))
    served: collections.Counter[str] = collections.Counter()
    failed_attempts: collections.Counter[str] = collections.Counter()
    store = open_store(store_url)
    try:
        for session, got in report["received"].items():
            [event] = await store.messages(session)
            assert isinstance(event, MessageEvent), session
            assert isinstance(event.routed, Routed), session
            served[event.routed.deployment] += 1
            for attempt in event.routed.attempts:
                failed_attempts[attempt.failure] += 1
            expected = recorded if event.routed.deployment == "west" else east_text
            assert got["text"] == expected, session
    finally:
        await store.close()
    assert served["west"] == stand_in.count(200)
    assert served["east"] + served["west"] == len(report["received"])
    assert failed_attempts["server-error"] == stand_in.count(500)
    assert failed_attempts["rate-limited"] == stand_in.count(429) == 1
    assert failed_attempts["connect"] > 0  # the refused connections of phase 1
    report["figures"] |= {"served": dict(served), "failed_attempts": dict(failed_attempts)}


CROSS_ROUTES = """
[defaults]
failures = 100
first_byte_timeout_s = 20

[[models]]
name = "gpt-4o"
fallbacks = ["claude"]
  [[models.deployments]]
  name = "openai-refused"
  provider = "openai"
  model = "gpt-4o"
  base_url = "http://127.0.0.1:{refused}/v1"
  weight = 1000000
  [[models.deployments]]
  name = "openai-down"
  provider = "openai"
  model = "gpt-4o"
  base_url = "http://127.0.0.1:{down}/v1"
  weight = 0.000001

[[models]]
name = "claude"
  [[models.deployments]]
  name = "claude-main"
  provider = "anthropic"
  model = "text"
  base_url = "{scripted}"
  api_key_env = "CLAUDE_KEY"
"""


async def test_an_openai_caller_falls_back_to_an_anthropic_group_with_no_field_dropped(
    nc: Any, topology: Topology
) -> None:
    """Both OpenAI-dialect deployments fail (one refuses connections, one answers 500): an
    OpenAI SDK caller is served by the Anthropic-dialect fallback, its request translated
    field by field; a field Anthropic has no place for keeps the fallback from being used
    (the caller is told why) unless the caller opts in to dropping it, which the answer
    lists. The oracle is the scripted provider's script for the request it received."""
    stand_in = StandIn(b"")
    stand_in.mode = "500"
    refused, down = free_port(), free_port()
    env = {"CLAUDE_KEY": "sk-ant-SENTINEL-424242"}
    async with ScriptedServer(SCRIPTED) as scripted, serving(stand_in, [down]):
        routes = parse_routes(
            CROSS_ROUTES.format(refused=refused, down=down, scripted=scripted.url).encode(), env
        )
        real = await broker_deps(nc, topology)
        settings = GatewaySettings(
            port=0,
            keys=frozenset({GATEWAY_KEY}),
            partitions=topology.partitions,
            ack_timeout_s=10.0,
            routes=routes,
            routes_env=env,
        )
        try:
            async with GatewayServer(settings, real.deps) as server:
                await _cross_dialect_calls(server.url, scripted)
        finally:
            await real.aclose()
    assert stand_in.count(500) == 3  # each call tried both OpenAI deployments first


async def _cross_dialect_calls(url: str, scripted: ScriptedServer) -> None:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=GATEWAY_KEY, max_retries=0)
    messages: Any = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model="gpt-4o",
            messages=messages,
            stream=True,
            max_tokens=64,
            temperature=0.3,
            top_p=0.9,
            stop=["\n\n\n"],
            user="agent-7",
        )
        assert "x-tokenwire-dropped-params" not in raw.headers
        got = await collect_openai(raw.parse())
        sent = scripted.received[-1]
        assert sent.path == "/v1/messages"
        body = sent.json()
        assert body["model"] == "text"
        assert body["system"] == "Be brief."
        assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
        assert (body["max_tokens"], body["temperature"], body["top_p"]) == (64, 0.3, 0.9)
        assert body["stop_sequences"] == ["\n\n\n"]
        assert body["metadata"] == {"user_id": "agent-7"}
        expected = expected_outcome("text", body, SCRIPTED, dialect="anthropic")
        assert expected.message is not None
        assert got["text"] == "".join(
            b.text for b in expected.message.content if hasattr(b, "text")
        )
        # a field with no Anthropic counterpart: the fallback is not used, and the caller is
        # told which fallback was not tried and why
        before = len(scripted.received)
        with pytest.raises(openai.InternalServerError, match="fallback claude-main not tried"):
            await client.chat.completions.create(
                model="gpt-4o", messages=messages, stream=True, seed=7
            )
        assert len(scripted.received) == before
        # ... unless the caller opts in to dropping it: then the answer says what was dropped
        raw = await client.chat.completions.with_raw_response.create(
            model="gpt-4o",
            messages=messages,
            stream=True,
            seed=7,
            extra_headers={"x-tokenwire-drop-params": "true"},
        )
        assert raw.headers["x-tokenwire-dropped-params"] == "seed"
        assert (await collect_openai(raw.parse()))["text"] == got["text"]
        assert "seed" not in scripted.received[-1].json()
    finally:
        await client.close()
