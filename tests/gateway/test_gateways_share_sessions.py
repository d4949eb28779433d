"""Two and four gateway processes share sessions: any turn of a session may reach any gateway.

Real parts: ``tokenwire gateway`` processes on their own sockets, one real nats-server (the
step registry is its KV bucket), the scripted provider on a socket, the OpenAI wire over
httpx. Every session's turns go round-robin over the gateways, some sessions get two new
turns at once through two gateways, and the stream must hold each step once with contiguous
ordinals and the scripted content. The only conflict is the documented one: an explicit
(session, turn, step) claimed twice is refused with 409, whichever gateway sees it second.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures.broker import close_client
from tests.gateway._helpers import GATEWAY_KEY, provider_env
from tests.gateway.test_gateway_real import SCRIPTED, by_session, expected, read_stream
from tokenwire.broker import EmbeddedServer, Topology, connect, ensure_topology, free_port
from tokenwire.fold import fold
from tokenwire.schemas import Message
from tokenwire.services.scripted_provider import ScriptedServer

SESSIONS = 8
TURNS = 3
RACED = 4  # sessions that get two new turns at once, through two gateways
AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}


@contextmanager
def gateways(count: int, nats_url: str, scripted_url: str, tmp: Path) -> Iterator[list[str]]:
    """``count`` gateway processes; yields their base URLs once each answers /readyz."""
    procs: list[subprocess.Popen[bytes]] = []
    urls: list[str] = []
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOKENWIRE_")}
    try:
        for i in range(count):
            port = free_port()
            env = (
                base
                | provider_env(TOKENWIRE_SCRIPTED_BASE_URL=scripted_url)
                | {
                    "TOKENWIRE_NATS_URL": nats_url,
                    "TOKENWIRE_PROVISION": "0",
                    "TOKENWIRE_GATEWAY_KEYS": GATEWAY_KEY,
                    "TOKENWIRE_GATEWAY_ADDR": f"127.0.0.1:{port}",
                    "TOKENWIRE_DATA_DIR": str(tmp / f"data{i}"),
                }
            )
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


async def until_ready(client: httpx.AsyncClient, url: str, timeout_s: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        try:
            if (await client.get(f"{url}/readyz")).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if loop.time() > deadline:
            raise AssertionError(f"gateway {url} not ready in {timeout_s} s")
        await asyncio.sleep(0.1)


async def turn(
    client: httpx.AsyncClient, url: str, session: str, text: str, **ids: int
) -> tuple[int, dict[str, Any], list[dict[str, Any]]]:
    """One streamed OpenAI-dialect request; (status, identity headers, messages sent)."""
    messages = [{"role": "user", "content": text}]
    body = {"model": "scripted/text", "messages": messages, "stream": True}
    headers = {**AUTH, "x-tokenwire-session": session}
    headers |= {f"x-tokenwire-{k}": str(v) for k, v in ids.items()}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        await r.aread()
    got = {k: r.headers.get(f"x-tokenwire-{k}") for k in ("turn", "step")}
    return r.status_code, got, messages


@pytest.mark.slow
@pytest.mark.parametrize("count", [2, 4])
async def test_gateways_share_sessions_with_no_conflict_but_the_documented_409(
    tmp_path: Path, count: int
) -> None:
    server = EmbeddedServer(tmp_path / "nats").start()
    nc = await connect(server.url)
    topology = Topology()
    try:
        await ensure_topology(nc, topology)
        async with ScriptedServer(SCRIPTED) as scripted:
            with gateways(count, server.url, scripted.url, tmp_path) as urls:
                async with httpx.AsyncClient(timeout=60) as client:
                    for url in urls:
                        await until_ready(client, url)
                    sent = await run_sessions(client, urls)
                    await check_the_documented_conflict(client, urls)
        sessions = by_session(await read_stream(nc, topology))
        for session, steps in sent.items():
            envs = sessions[session]
            turns = sorted({e.turn for e in envs})
            assert turns == list(range(len(steps))), session  # each turn once, none lost
            for turn_no, messages in steps.items():
                step = [e for e in envs if e.turn == turn_no]
                assert {e.step for e in step} == {0}
                assert [e.ordinal for e in step] == list(range(len(step))), (session, turn_no)
                want = expected("openai", "text", session, messages)
                got = fold([e.chunk for e in step])
                assert isinstance(got, Message), (session, turn_no)
                assert got.text == want.text, (session, turn_no)
    finally:
        await close_client(nc)
        server.stop()


async def run_sessions(
    client: httpx.AsyncClient, urls: list[str]
) -> dict[str, dict[int, list[dict[str, Any]]]]:
    """Each session's turns round-robin over the gateways; the first RACED sessions also get
    two new turns at once through two different gateways. Returns turn -> messages sent."""
    sent: dict[str, dict[int, list[dict[str, Any]]]] = {}

    async def session(i: int) -> None:
        name = f"shared-{i:02d}"
        sent[name] = {}
        for k in range(TURNS):
            status, ids, messages = await turn(client, urls[(i + k) % len(urls)], name, f"t{k}")
            assert status == 200, (name, k)
            assert ids["step"] == "0"
            sent[name][int(ids["turn"])] = messages
        if i < RACED:
            raced = await asyncio.gather(
                turn(client, urls[0], name, "race a"), turn(client, urls[1], name, "race b")
            )
            assert [status for status, *_ in raced] == [200, 200], name
            for _, ids, messages in raced:
                sent[name][int(ids["turn"])] = messages

    await asyncio.gather(*(session(i) for i in range(SESSIONS)))
    for name, turns in sent.items():  # no two requests were given the same turn
        assert len(turns) == TURNS + (2 if int(name[-2:]) < RACED else 0), name
    return sent


async def check_the_documented_conflict(client: httpx.AsyncClient, urls: list[str]) -> None:
    """An explicit triple is claimed once: a second claim by another request is a 409 on any
    gateway (the same request resumes the step on any gateway), and of two different requests
    at once through two gateways exactly one wins."""
    first, _, _ = await turn(client, urls[0], "explicit-a", "x", turn=0, step=0)
    again = [(await turn(client, url, "explicit-a", "y", turn=0, step=0))[0] for url in urls]
    resumed = [(await turn(client, url, "explicit-a", "x", turn=0, step=0))[0] for url in urls]
    assert (first, again, resumed) == (200, [409] * len(urls), [200] * len(urls))
    raced = await asyncio.gather(
        *(turn(client, url, "explicit-b", f"x{i}", turn=0, step=0) for i, url in enumerate(urls))
    )
    assert sorted(status for status, *_ in raced) == [200] + [409] * (len(urls) - 1)
