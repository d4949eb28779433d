"""Done-when of the limits and budgets (docs/gateway.md, "Limits and budgets"; ADR 0042): one
key's requests per minute and budget are exact across three gateways.

Real parts: one nats-server (the allowances bucket), three gateways, each on its own socket and
its own broker connection, a stand-in OpenAI deployment on a socket answering with a recorded
stream (openai/chat-text-include-usage.sse: 14 input and 8 output tokens), the official openai
SDK as every caller (``max_retries=0``), the assembler in burst mode into SQLite (the ledger).
The gateways run in this process so that their limits' clock can be pinned to one minute: the
rpm test never straddles a minute's end, however slow the machine (the window is the only
thing pinned; every other clock is real).

Oracles: the limit and the budget written in the keys file; the stand-in's count of the calls
that reached it; the ledger's cost per line (genai-prices) and the reservation computed here
from the bytes the SDK sent (the gateway's rule: body length + max_tokens, at the price).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from tests.fixtures.broker import close_client
from tests.gateway._helpers import recording, stored_by_burst
from tests.gateway.test_gateways_share_sessions import until_ready
from tokenwire.broker import (
    Allowances,
    EmbeddedServer,
    Topology,
    connect,
    ensure_topology,
    free_port,
)
from tokenwire.ledger import price_step, to_usd
from tokenwire.schemas import TokenUsage
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps, parse_keys
from tokenwire.store import open_store

pytestmark = pytest.mark.slow

KEY = "agent-key-SENTINEL-4646"
BODY = recording("openai/chat-text-include-usage.sse")
MESSAGES: Any = [{"role": "user", "content": "What is the capital of Mexico?"}]
PINNED_NS = (1_796_000_000 // 60 * 60 + 20) * 10**9
"""The limits' clock in these gateways: 20 s into a UTC minute (40 s before its end)."""


class StandIn:
    """The OpenAI deployment: every request answered with the recording, counted."""

    def __init__(self) -> None:
        self.served = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        while (await receive()).get("more_body"):
            pass
        self.served += 1
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": BODY})


@contextlib.asynccontextmanager
async def serving(app: StandIn) -> AsyncIterator[str]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        async with asyncio.timeout(30):
            while not server.started:  # noqa: ASYNC110 - uvicorn's flag, no event to wait on
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


def keys_file(limits: str) -> str:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    return f'[[keys]]\nname = "agent"\nsha256 = "{digest}"\nlimits = {limits}\n'


@contextlib.asynccontextmanager
async def gateways(
    nats_url: str, keys: str, upstream: str, clock: Callable[[], int]
) -> AsyncIterator[list[str]]:
    """Three gateways on one broker, each its own connection, the keys file seeding the keys
    bucket; yields their base URLs."""
    async with contextlib.AsyncExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tw-limits-")))
        keys_path = folder / "keys.toml"
        keys_path.write_text(keys)
        urls = []
        for _ in range(3):
            nc = await connect(nats_url)
            stack.push_async_callback(close_client, nc)
            built = await broker_deps(nc, Topology())
            stack.push_async_callback(built.aclose)
            settings = GatewaySettings(
                host="127.0.0.1",
                port=0,
                named_keys=parse_keys(keys.encode()),
                keys_file=str(keys_path),
                provider_env={
                    "OPENAI_API_KEY": "sk-openai-SENTINEL-0046",
                    "TOKENWIRE_OPENAI_BASE_URL": f"{upstream}/v1",
                },
                topology=Topology(),
            )
            deps = replace(built.deps, limits_clock_ns=clock)
            server = await stack.enter_async_context(GatewayServer(settings, deps))
            urls.append(server.url)
        yield urls


@pytest.fixture
async def broker_url(tmp_path: Path) -> AsyncIterator[str]:
    server = EmbeddedServer(tmp_path / "nats").start()
    try:
        nc = await connect(server.url)
        try:
            await ensure_topology(nc, Topology())
        finally:
            await close_client(nc)
        yield server.url
    finally:
        server.stop()


def clients(urls: list[str], **kwargs: Any) -> list[openai.AsyncOpenAI]:
    return [
        openai.AsyncOpenAI(base_url=f"{u}/v1", api_key=KEY, max_retries=0, **kwargs) for u in urls
    ]


async def streamed(client: openai.AsyncOpenAI, **extra: Any) -> None:
    stream = await client.chat.completions.create(
        model="openai/gpt-4o", messages=MESSAGES, stream=True, **extra
    )
    async for _ in stream:
        pass


async def test_three_gateways_admit_exactly_60_of_300_requests_at_60_rpm(broker_url: str) -> None:
    stand_in = StandIn()
    admitted: list[int] = []
    refused: list[openai.RateLimitError] = []
    async with serving(stand_in) as upstream:
        keys = keys_file("{ rpm = 60 }")
        async with gateways(broker_url, keys, upstream, lambda: PINNED_NS) as urls:
            sdks = clients(urls)
            turn = iter(range(300))

            async def caller() -> None:
                for n in turn:  # 30 callers share the 300 requests, round-robin by number
                    try:
                        await streamed(sdks[n % 3])
                        admitted.append(n)
                    except openai.RateLimitError as exc:
                        refused.append(exc)

            await asyncio.gather(*(caller() for _ in range(30)))
            for sdk in sdks:
                await sdk.close()
    assert (len(admitted), len(refused)) == (60, 240)
    assert stand_in.served == 60
    assert {n % 3 for n in admitted} == {0, 1, 2}  # every gateway admitted some
    for exc in refused:
        headers = exc.response.headers
        assert headers["x-ratelimit-limit-requests"] == "60"
        assert headers["x-ratelimit-remaining-requests"] == "0"
        assert headers["x-ratelimit-reset-requests"] == "40s"
        assert headers["retry-after"] == "40"
        assert exc.code == "rate_limit_error"
    nc = await connect(broker_url)
    try:
        minute = PINNED_NS // 10**9 // 60
        pool = await Allowances(nc, Topology().limits_bucket).read(f"rpm.key.agent.{minute}")
    finally:
        await close_client(nc)
    assert pool.used == 60
    print({"admitted": len(admitted), "refused": len(refused), "served": stand_in.served})


BUDGET_PUSD = 10**10  # $0.01
COST_PUSD = 115_000_000  # the recording's 14 input and 8 output tokens of gpt-4o


async def test_a_budget_over_three_gateways_and_50_callers_is_never_crossed(
    broker_url: str, tmp_path: Path
) -> None:
    sent: list[bytes] = []

    async def keep(request: httpx.Request) -> None:
        sent.append(request.content)

    stand_in = StandIn()
    first_refusal: list[str] = []
    async with serving(stand_in) as upstream:
        keys = keys_file('{ budget = { usd = "0.01", period = "day" } }')
        async with gateways(broker_url, keys, upstream, lambda: PINNED_NS) as urls:
            hooked = httpx.AsyncClient(event_hooks={"request": [keep]})
            sdks = clients(urls, http_client=hooked)

            async def caller(i: int) -> None:
                for _ in range(BUDGET_PUSD // COST_PUSD + 1):  # more than the budget pays for
                    try:
                        await streamed(sdks[i % 3], max_tokens=8)
                    except openai.RateLimitError as exc:
                        first_refusal.append(f"{exc.code}: {exc.message}")
                        return
                raise AssertionError("never refused")

            await asyncio.gather(*(caller(i) for i in range(50)))
            concurrent = stand_in.served
            # then one caller alone, until refused: nothing in flight any more
            for n in range(100):
                try:
                    await streamed(sdks[n % 3], max_tokens=8)
                except openai.RateLimitError:
                    break
            await hooked.aclose()
    spent, steps = await _ledger(broker_url, tmp_path)
    reservation = _reservation(sent[0])
    assert steps == stand_in.served
    assert spent == steps * COST_PUSD
    assert spent <= BUDGET_PUSD
    assert BUDGET_PUSD - spent < reservation  # refused only when the next one would cross it
    assert all(r.startswith("insufficient_quota: ") for r in first_refusal)
    assert "daily budget of key agent ($0.01 per UTC day)" in first_refusal[0]
    nc = await connect(broker_url)
    try:
        pools = await Allowances(nc, Topology().limits_bucket).pools()
    finally:
        await close_client(nc)
    [(key, pool)] = [(k, p) for k, p in pools.items() if k.startswith("usd.key.agent.")]
    assert pool.used == spent  # settled to the ledger's exact cost
    assert pool.holds == {}  # every gateway gave its hold back when it stopped
    [row] = _cli_rows(broker_url)
    assert (row["scope"], row["name"], row["counter"]) == ("key", "agent", "usd")
    assert (row["used"], row["limit"]) == (f"{to_usd(spent):f}", "0.01 per day")
    figures = {"calls": steps, "alone_after": steps - concurrent, "spent_pusd": spent}
    print(figures | {"reservation_pusd": reservation, "key": key})


def _cli_rows(broker_url: str) -> list[dict[str, Any]]:
    """``tokenwire limits --json`` against the broker (the limits from its keys bucket)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOKENWIRE_")}
    env = base | {"TOKENWIRE_NATS_URL": broker_url}
    out = subprocess.run(
        [sys.executable, "-m", "tokenwire", "limits", "--json"],
        env=env,
        capture_output=True,
        check=True,
        timeout=120,
    )
    rows: list[dict[str, Any]] = msgspec.json.decode(out.stdout)["rows"]
    return rows


def _reservation(sent: bytes) -> int:
    """The gateway's rule, computed here: the canonical body's bytes as input tokens and
    max_tokens as output tokens, at gpt-4o's price."""
    canonical = msgspec.json.encode(msgspec.json.decode(sent), order="sorted")
    usage = TokenUsage(input_tokens=len(canonical), output_tokens=8)
    cost = price_step("openai", "gpt-4o", usage, 0).pusd
    assert cost is not None
    return cost


async def _ledger(broker_url: str, tmp: Path) -> tuple[int, int]:
    """The key's recorded spend and priced steps, from the store the assembler wrote."""
    store_url = await stored_by_burst(broker_url, tmp)
    store = open_store(store_url)
    try:
        groups = await store.usage("key")
    finally:
        await store.close()
    [group] = [g for g in groups if g.key == "agent"]
    assert group.totals.priced == group.totals.steps
    return group.totals.cost_pusd, group.totals.steps


class HeldOpen(StandIn):
    """The deployment, but the first request's answer stops after its first events until
    ``release`` is set (a stream in flight when its gateway dies)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.first_sent = asyncio.Event()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.served > 0:
            await super().__call__(scope, receive, send)
            return
        while (await receive()).get("more_body"):
            pass
        self.served += 1
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        events = BODY.split(b"\n\n")
        opening = b"\n\n".join(events[:3]) + b"\n\n"  # the role and the first words
        await send({"type": "http.response.body", "body": opening, "more_body": True})
        self.first_sent.set()
        await self.release.wait()


@contextlib.contextmanager
def gateway_process(nats_url: str, keys: Path, upstream: str, tmp: Path, i: int) -> Any:
    """One ``tokenwire gateway`` process with these keys; yields (url, process)."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENWIRE_")} | {
        "TOKENWIRE_NATS_URL": nats_url,
        "TOKENWIRE_PROVISION": "0",
        "TOKENWIRE_GATEWAY_KEYS_FILE": str(keys),
        "TOKENWIRE_GATEWAY_ADDR": f"127.0.0.1:{port}",
        "TOKENWIRE_DATA_DIR": str(tmp / f"data{i}"),
        "TOKENWIRE_LIMITS_HOLD_TTL_S": "3",
        "OPENAI_API_KEY": "sk-openai-SENTINEL-0046",
        "TOKENWIRE_OPENAI_BASE_URL": f"{upstream}/v1",
    }
    with (tmp / f"gateway{i}.log").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tokenwire", "gateway"], env=env, stdout=out, stderr=out
        )
    try:
        yield f"http://127.0.0.1:{port}", proc
    finally:
        proc.kill()
        proc.wait(20)


async def test_a_dead_gateways_stream_slot_is_freed_and_its_reservation_charged(
    broker_url: str, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.toml"
    keys.write_text(keys_file('{ concurrent = 1, budget = { usd = "0.01", period = "day" } }'))
    sent: list[bytes] = []

    async def keep(request: httpx.Request) -> None:
        if request.method == "POST":
            sent.append(request.content)

    stand_in = HeldOpen()
    async with serving(stand_in) as upstream, _released(stand_in):
        with (
            gateway_process(broker_url, keys, upstream, tmp_path, 0) as (first, dying),
            gateway_process(broker_url, keys, upstream, tmp_path, 1) as (second, _),
        ):
            async with httpx.AsyncClient(timeout=10, event_hooks={"request": [keep]}) as http:
                for url in (first, second):
                    await until_ready(http, url)
                a, b = clients([first, second], http_client=http)
                held = await a.chat.completions.create(
                    model="openai/gpt-4o", messages=MESSAGES, stream=True, max_tokens=8
                )
                await held.__anext__()  # the stream is in flight on the first gateway
                with pytest.raises(openai.RateLimitError, match="limit of 1 streams"):
                    await streamed(b, max_tokens=8)  # one stream across both gateways
                dying.send_signal(signal.SIGKILL)
                dying.wait(20)
                await _admitted_within(b, timeout_s=60)  # once its hold ended (3 s)
                # the dead gateway's reservation is charged in full, the second call at its
                # exact cost (given back by the live gateway right after its call ended)
                expected = _reservation(sent[0]) + COST_PUSD
                spent = await _spend_settled(broker_url, expected, timeout_s=60)
    assert spent == expected
    assert stand_in.served == 2


async def _spend_settled(broker_url: str, spent: int, timeout_s: float) -> int:
    """The key's spend once it reaches ``spent`` with no live hold (bounded wait): ``used``
    plus the holds that ended unrenewed (charged in full by rule, whether or not a gateway
    has written the counter since: the dead gateway's hold may end after the live one's last
    write)."""
    nc = await connect(broker_url)
    try:
        board = Allowances(nc, Topology().limits_bucket)
        async with asyncio.timeout(timeout_s):
            while True:
                pools = await board.pools()
                [pool] = [p for k, p in pools.items() if k.startswith("usd.key.agent.")]
                now = time.time_ns()
                charged = pool.used + sum(
                    h.amount for h in pool.holds.values() if h.until_ns <= now
                )
                if charged >= spent and pool.held(now_ns=now) == 0:
                    return charged
                await asyncio.sleep(0.1)
    finally:
        await close_client(nc)


@contextlib.asynccontextmanager
async def _released(stand_in: HeldOpen) -> AsyncIterator[None]:
    """The held answer ends when the block does (else the stand-in's stop waits for it)."""
    try:
        yield
    finally:
        stand_in.release.set()


async def _admitted_within(client: openai.AsyncOpenAI, timeout_s: float) -> None:
    """Call until one call is admitted (bounded); a refusal must be the stream limit's."""
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                await streamed(client, max_tokens=8)
                return
            except openai.RateLimitError as exc:
                if "limit of 1 streams" not in exc.message:
                    raise
            await asyncio.sleep(0.2)
