"""Done-when of keys in the broker (issue 46, part 1; ADR 0041): a key created in the keys
bucket is accepted by three running gateways without a restart; revoked (through one
gateway's operator API) while 20 of its streams run on the three, it is refused on every
gateway soon after (the time from the revoke's acknowledgement to the first refusal on each
gateway is measured and printed, polled with a bound, never asserted against a clock); the 20
running streams finish whole and are recorded.

Real parts: three ``tokenwire gateway`` processes on their own sockets, one nats-server (the
keys bucket), the scripted provider on a socket, the official openai SDK as every caller
(``max_retries=0``), the assembler in burst mode into SQLite. Oracle: the scripted provider's
script (``expected_outcome``) for each session.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.fixtures.broker import close_client
from tests.gateway._helpers import GATEWAY_KEY, stored_by_burst
from tests.gateway.test_gateway_real import sent_body
from tests.gateway.test_gateways_share_sessions import gateways, until_ready
from tokenwire.broker import EmbeddedServer, Topology, connect, ensure_topology
from tokenwire.schemas import MessageEvent
from tokenwire.services.scripted_provider import ScriptedServer, ScriptedSettings, expected_outcome
from tokenwire.store import open_store

pytestmark = pytest.mark.slow

STREAMS = 20
SCRIPTED = ScriptedSettings(seed=46, length=60, token_rate=15.0)
"""Each stream takes about 4 s: the revoke lands while all 20 run."""
BOUND_S = 30.0
OPERATOR = {"authorization": f"Bearer {GATEWAY_KEY}"}


def sdk(url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


async def accepted(client: httpx.AsyncClient, url: str, key: str) -> bool:
    """Whether a gateway accepts ``key`` now: a key-checked route that asks no provider (an
    unknown response id: 404 once the key is accepted, 401 before)."""
    headers = {"authorization": f"Bearer {key}"}
    answer = await client.get(f"{url}/v1/responses/resp_unknown", headers=headers)
    assert answer.status_code in (401, 404), answer.text
    return answer.status_code == 404


async def refused(client: httpx.AsyncClient, url: str, key: str) -> bool:
    return not await accepted(client, url, key)


async def poll(check: Any, what: str) -> float:
    """Wait (bounded) until ``await check()`` holds; the monotonic time it first held."""
    deadline = time.monotonic() + BOUND_S
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {BOUND_S:g} s: {what}")
        await asyncio.sleep(0.005)
    return time.monotonic()


class Stream:
    """One caller's stream through the SDK: its first chunk, then all of it."""

    def __init__(self, client: openai.AsyncOpenAI, session: str) -> None:
        self.session = session
        self.started = asyncio.Event()
        self.text = ""
        self.finish: str | None = None
        self.task = asyncio.create_task(self._run(client))

    async def _run(self, client: openai.AsyncOpenAI) -> None:
        stream = await client.chat.completions.create(
            model="scripted/text",
            messages=[{"role": "user", "content": self.session}],
            stream=True,
            extra_headers={"x-tokenwire-session": self.session},
        )
        async for chunk in stream:
            self.started.set()
            for choice in chunk.choices:
                self.text += choice.delta.content or ""
                self.finish = choice.finish_reason or self.finish


def expected_text(session: str) -> str:
    messages = [{"role": "user", "content": session}]
    body = sent_body("openai", "text", messages)
    headers = {"X-Tokenwire-Session": session}
    outcome = expected_outcome("text", body, SCRIPTED, headers=headers, dialect="openai")
    assert outcome.message is not None
    return outcome.message.text


@pytest.mark.timeout(300)
async def test_a_revoked_key_is_refused_on_every_gateway_and_its_running_streams_finish(
    tmp_path: Path,
) -> None:
    server = EmbeddedServer(tmp_path / "nats").start()
    nc = await connect(server.url)
    try:
        await ensure_topology(nc, Topology())
        async with ScriptedServer(SCRIPTED) as scripted:
            with gateways(3, server.url, scripted.url, tmp_path) as urls:
                figures = await _revoke_while_streaming(urls)
        await _recorded(server.url, tmp_path, figures["sessions"])
    finally:
        await close_client(nc)
        server.stop()
    print("\nrevoke figures:", json.dumps(figures["measured"]))


async def _revoke_while_streaming(urls: list[str]) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=30) as client:
        for url in urls:
            await until_ready(client, url)
        made = await client.post(
            f"{urls[0]}/v1/keys", json={"name": "agent", "tenant": "team"}, headers=OPERATOR
        )
        assert made.status_code == 201, made.text
        key = made.json()["key"]
        callers = [sdk(url, key) for url in urls]
        try:
            return await _stream_and_revoke(client, urls, callers)
        finally:
            for caller in callers:
                await caller.close()


async def _stream_and_revoke(
    client: httpx.AsyncClient, urls: list[str], callers: list[openai.AsyncOpenAI]
) -> dict[str, Any]:
    created = time.monotonic()
    key = callers[0].api_key
    accepted_at = await asyncio.gather(
        *(poll(lambda u=u: accepted(client, u, key), f"{u} accepts") for u in urls)
    )
    streams = [Stream(callers[i % 3], f"revoke-{i:02d}") for i in range(STREAMS)]
    async with asyncio.timeout(BOUND_S):
        await asyncio.gather(*(s.started.wait() for s in streams))
    assert not any(s.task.done() for s in streams)  # all 20 are running

    revoked = await client.delete(f"{urls[1]}/v1/keys/agent", headers=OPERATOR)
    assert revoked.status_code == 200, revoked.text
    acked = time.monotonic()
    running = sum(not s.task.done() for s in streams)
    refused_at = await asyncio.gather(
        *(poll(lambda u=u: refused(client, u, key), f"{u} refuses") for u in urls)
    )
    for caller in callers:  # a model call is refused too, in OpenAI's shape
        with pytest.raises(openai.AuthenticationError):
            await caller.chat.completions.create(
                model="scripted/text", messages=[{"role": "user", "content": "x"}]
            )
    await asyncio.gather(*(s.task for s in streams))
    for s in streams:
        assert s.finish == "stop", s.session
        assert s.text == expected_text(s.session), s.session
    measured = {
        "created_to_accepted_s": [round(t - created, 4) for t in accepted_at],
        "revoke_acked_to_refused_s": [round(t - acked, 4) for t in refused_at],
        "streams_running_at_revoke": running,
    }
    return {"measured": measured, "sessions": {s.session: s.text for s in streams}}


async def _recorded(broker_url: str, tmp: Path, sessions: dict[str, str]) -> None:
    """Every stream that ran across the revoke is stored whole."""
    store_url = await stored_by_burst(broker_url, tmp)
    store = open_store(store_url)
    try:
        for session, text in sessions.items():
            [event] = await store.messages(session)
            assert isinstance(event, MessageEvent), session
            assert event.message.text == text, session
        [by_key] = await store.usage("key", tenant="team")
        assert by_key.key == "agent"
        assert by_key.totals.steps == len(sessions)
    finally:
        await store.close()
