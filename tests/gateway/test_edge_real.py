"""The gateway's edge tried from outside (issue 43): bounded metrics, a keyless gateway and
browsers, strict input, cursors past the end, transport errors. A real socket, a real
nats-server, the scripted provider on a socket, a SQLite store; the callers are the official
SDKs where the claim is about them, plain HTTP where an SDK cannot send the input (a text/plain
body, a foreign ``Host``, a repeated JSON name).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

import anthropic
import httpx
import openai
import pytest
from nats.aio.client import Client

from tests.gateway._helpers import GATEWAY_KEY, provider_env
from tokenwire.broker import Topology, free_port
from tokenwire.replay import events_router
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.services.gateway._dialects.validate import MAX_OUTPUT_TOKENS
from tokenwire.services.scripted_provider import ScriptedServer, ScriptedSettings
from tokenwire.store import open_store

JSON = {"content-type": "application/json"}
HELLO: list[Any] = [{"role": "user", "content": "hi"}]
CONCURRENCY = 4
"""Requests in flight at once in :func:`bounded` (what is counted does not depend on it). Not
more: httpx's pool spends CPU that grows with the connections it juggles, and at 32 the
client was most of the test's CPU (the 3,500 requests took ~3x as long)."""


@dataclass
class Gateway:
    url: str
    scripted: ScriptedServer
    nc: Client
    topology: Topology

    @property
    def host(self) -> str:
        return self.url.removeprefix("http://")

    async def published(self) -> int:
        """Messages on the chunk stream now."""
        info = await self.nc.jetstream().stream_info(self.topology.stream)
        return info.state.messages


@asynccontextmanager
async def serving(
    nc: Client,
    topology: Topology,
    sqlite_url: str,
    env: dict[str, str] | None = None,
    **settings: Any,
) -> AsyncIterator[Gateway]:
    """A gateway on a real socket (keyless unless ``keys`` is given), the session routes on
    a SQLite store, the scripted provider behind it as ``scripted/...`` and as OpenAI's
    Chat Completions (``openai/...``, so a Responses caller there is translated)."""
    store = open_store(sqlite_url)
    async with ScriptedServer(ScriptedSettings(seed=4, length=6)) as scripted:
        behind = {
            "TOKENWIRE_SCRIPTED_BASE_URL": scripted.url,
            "TOKENWIRE_OPENAI_BASE_URL": f"{scripted.url}/v1",
            **(env or {}),
        }
        variables = provider_env(**behind)
        config = GatewaySettings(
            port=0,
            provider_env=variables,
            partitions=topology.partitions,
            ack_timeout_s=10.0,
            **settings,
        )
        real = await broker_deps(nc, topology)
        routes = events_router(lambda: nc, topology, lambda: store).routes
        deps = replace(real.deps, extra_routes=routes, store=lambda: store)
        try:
            async with GatewayServer(config, deps) as server:
                yield Gateway(server.url, scripted, nc, topology)
        finally:
            await real.aclose()
            await store.close()


@pytest.fixture
async def keyless(nc: Client, topology: Topology, sqlite_url: str) -> AsyncIterator[Gateway]:
    async with serving(nc, topology, sqlite_url) as gateway:
        yield gateway


@pytest.fixture
async def keyed(nc: Client, topology: Topology, sqlite_url: str) -> AsyncIterator[Gateway]:
    async with serving(nc, topology, sqlite_url, keys=frozenset({GATEWAY_KEY})) as gateway:
        yield gateway


def oai(gateway: Gateway, key: str = "x") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)


def claude(gateway: Gateway, key: str = "x") -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=gateway.url, api_key=key, max_retries=0)


async def bounded(calls: Sequence[Callable[[], Awaitable[httpx.Response]]]) -> list[int]:
    """Run ``calls`` at most :data:`CONCURRENCY` at once; their statuses."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(call: Callable[[], Awaitable[httpx.Response]]) -> int:
        async with gate:
            return (await call()).status_code

    return list(await asyncio.gather(*(one(c) for c in calls)))


# -- 1. /metrics: route templates, bounded ---------------------------------------------------


def request_series(text: str) -> set[str]:
    """The label sets of ``tokenwire_gateway_requests_total`` in an exposition."""
    return set(re.findall(r"^tokenwire_gateway_requests_total(\{[^}]*\})", text, re.MULTILINE))


@pytest.mark.slow
async def test_thousands_of_ids_and_junk_paths_leave_the_metrics_as_they_were(
    keyless: Gateway,
) -> None:
    """Every request is labelled with its route's template: 2,000 retrievals of random
    response ids, 1,000 junk paths and 500 random sessions' events add no series and name no
    id, and the page stays within a few KB (only counts grow)."""
    ids = [f"resp_{uuid.uuid4().hex}" for _ in range(2000)]
    junk = [f"/{uuid.uuid4().hex}/{uuid.uuid4().hex[:8]}" for _ in range(1000)]
    sessions = [f"s-{uuid.uuid4().hex}" for _ in range(500)]
    async with httpx.AsyncClient(base_url=keyless.url, timeout=30) as client:
        # one of each kind first: the series they make exist before the snapshot
        for path in (f"/v1/responses/{ids[0]}", junk[0], f"/v1/sessions/{sessions[0]}/messages"):
            assert (await client.get(path)).status_code == 404
        before = (await client.get("/metrics")).text
        paths = [f"/v1/responses/{i}" for i in ids[1:]] + junk[1:]
        paths += [f"/v1/sessions/{s}/messages" for s in sessions[1:]]
        calls = [functools.partial(client.get, path) for path in paths]
        assert set(await bounded(calls)) == {404}
        after = (await client.get("/metrics")).text
    assert request_series(after) == request_series(before)
    assert '{route="/v1/responses/{response_id}",status="404"}' in after
    assert '{route="unmatched",status="404"}' in after
    assert abs(len(after) - len(before)) < 2048, (len(before), len(after))
    for seen in (*ids, *junk, *sessions):
        assert seen.strip("/").split("/")[0] not in after


async def test_a_metrics_key_guards_the_page(nc: Client, topology: Topology, sqlite_url: str):
    async with (
        serving(nc, topology, sqlite_url, metrics_key="scrape-SENTINEL-0a1b") as gateway,
        httpx.AsyncClient(base_url=gateway.url) as client,
    ):
        assert (await client.get("/metrics")).status_code == 401
        wrong = await client.get("/metrics", headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert "scrape-SENTINEL" not in wrong.text
        good = await client.get(
            "/metrics", headers={"authorization": "Bearer scrape-SENTINEL-0a1b"}
        )
        assert good.status_code == 200
        assert "tokenwire_gateway_requests_total" in good.text


# -- 2. a keyless gateway and browsers -------------------------------------------------------

MODEL_CALLS = [
    ("/v1/chat/completions", {"model": "scripted/text", "messages": HELLO}),
    ("/v1/messages", {"model": "scripted/text", "max_tokens": 16, "messages": HELLO}),
    ("/v1/responses", {"model": "openai/text", "input": "hi"}),
]


def error_of(path: str, response: httpx.Response) -> tuple[str, str | None]:
    """(type, param) of an error in the path's dialect (Anthropic's has no param)."""
    body = response.json()
    if path.startswith("/v1/messages"):
        assert body["type"] == "error"
        return body["error"]["type"], None
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]["type"], body["error"]["param"]


@pytest.fixture(params=["keyless", "keyed"])
async def either(
    request: pytest.FixtureRequest, nc: Client, topology: Topology, sqlite_url: str
) -> AsyncIterator[Gateway]:
    keys = frozenset({GATEWAY_KEY}) if request.param == "keyed" else frozenset()
    async with serving(nc, topology, sqlite_url, keys=keys) as gateway:
        yield gateway


async def test_a_text_plain_model_call_is_415_and_calls_nothing(either: Gateway) -> None:
    """What a web page can send anywhere without asking first (``text/plain``, a form) is
    refused on every model route, keys or not: no provider call, nothing published."""
    gateway = either
    auth = {"authorization": f"Bearer {GATEWAY_KEY}"}
    async with httpx.AsyncClient(base_url=gateway.url) as client:
        published = await gateway.published()
        for path, body in MODEL_CALLS:
            for kind in ("text/plain", "application/x-www-form-urlencoded", None):
                headers = {**auth, **({"content-type": kind} if kind else {})}
                sent = httpx.Request("POST", f"{gateway.url}{path}", json=body, headers=headers)
                if kind is None:
                    del sent.headers["content-type"]
                response = await client.send(sent)
                assert response.status_code == 415, (path, kind, response.text)
                kind_of, param = error_of(path, response)
                assert kind_of == "invalid_request_error"
                assert param in ("content-type", None)
                assert "Content-Type: application/json" in response.text
        assert len(gateway.scripted.received) == 0
        assert await gateway.published() == published


async def test_a_keyless_gateway_answers_only_loopback_hosts_and_its_own_pages(
    keyless: Gateway,
) -> None:
    """DNS rebinding (a foreign ``Host``) and another site's page (a foreign ``Origin``) are
    refused on every route; loopback names, any port, and the gateway's own origin are not."""
    port = keyless.host.rpartition(":")[2]
    async with httpx.AsyncClient(base_url=keyless.url) as client:
        for host in (
            "evil.example",
            f"evil.example:{port}",
            f"127.0.0.1.nip.io:{port}",
            "10.0.0.5",
            f"localhost.:{port}",
            "",
        ):
            for path in ("/v1/sessions", "/viewer", "/metrics", "/v1/messages"):
                response = await client.get(path, headers={"host": host})
                assert response.status_code == 403, (host, path, response.text)
                kind, _ = error_of(path, response)
                assert kind in ("permission_error", "invalid_request_error")
                assert "loopback" in response.text
        for origin in (
            "http://evil.example",
            "null",
            f"http://localhost:{port}",
            f"https://127.0.0.1:{port}",
        ):
            response = await client.get("/v1/sessions", headers={"origin": origin})
            assert response.status_code == 403, origin
            assert "no other site" in response.text
            call = await client.post(
                "/v1/chat/completions", json=MODEL_CALLS[0][1], headers={"origin": origin}
            )
            assert call.status_code == 403, origin
        for host in (
            keyless.host,
            f"localhost:{port}",
            f"[::1]:{port}",
            f"127.0.0.2:{port}",
            "localhost",
        ):
            assert (await client.get("/v1/sessions", headers={"host": host})).status_code == 200
        own = await client.get("/v1/sessions", headers={"origin": f"http://{keyless.host}"})
        assert own.status_code == 200
    assert len(keyless.scripted.received) == 0


async def test_keys_protect_a_gateway_whatever_the_host(keyed: Gateway) -> None:
    async with httpx.AsyncClient(base_url=keyed.url) as client:
        foreign = {"host": "evil.example", "origin": "http://evil.example"}
        assert (await client.get("/v1/sessions", headers=foreign)).status_code == 401
        auth = {**foreign, "authorization": f"Bearer {GATEWAY_KEY}"}
        assert (await client.get("/v1/sessions", headers=auth)).status_code == 200


# -- 3. strict input, in each dialect --------------------------------------------------------

HUGE = 10**30
BIG = 2**63
BAD_INPUTS: list[tuple[str, str, dict[str, Any], str]] = [
    # (dialect, what, extra body fields, the field the 400 names)
    ("chat", "max_tokens 10^30", {"max_tokens": HUGE}, "max_tokens"),
    ("chat", "max_tokens 2^63", {"max_tokens": BIG}, "max_tokens"),
    ("chat", "max_completion_tokens 2^63", {"max_completion_tokens": BIG}, "max_completion_tokens"),
    ("chat", "temperature -5", {"temperature": -5}, "temperature"),
    ("chat", "temperature 2.5", {"temperature": 2.5}, "temperature"),
    ("chat", "top_p 1.5", {"top_p": 1.5}, "top_p"),
    ("chat", "presence_penalty 3", {"presence_penalty": 3}, "presence_penalty"),
    ("chat", "frequency_penalty -2.5", {"frequency_penalty": -2.5}, "frequency_penalty"),
    ("chat", "n 2", {"n": 2}, "n"),
    ("chat", "seed 2^64", {"seed": 2**64}, "seed"),
    ("messages", "max_tokens 10^30", {"max_tokens": HUGE}, "max_tokens"),
    ("messages", "max_tokens 2^63", {"max_tokens": BIG}, "max_tokens"),
    ("messages", "temperature -5", {"temperature": -5}, "temperature"),
    ("messages", "temperature 1.5", {"temperature": 1.5}, "temperature"),
    ("messages", "top_p 1.5", {"top_p": 1.5}, "top_p"),
    ("messages", "top_k -1", {"top_k": -1}, "top_k"),
    ("responses", "max_output_tokens 10^30", {"max_output_tokens": HUGE}, "max_output_tokens"),
    ("responses", "max_output_tokens 2^63", {"max_output_tokens": BIG}, "max_output_tokens"),
    ("responses", "temperature -5", {"temperature": -5}, "temperature"),
    ("responses", "temperature 2.5", {"temperature": 2.5}, "temperature"),
    ("responses", "top_p 1.5", {"top_p": 1.5}, "top_p"),
]


async def sdk_call(gateway: Gateway, dialect: str, extra: dict[str, Any]) -> Any:
    """The call through the dialect's official SDK, the bad fields sent as the SDK sends
    any field it has no parameter for (``extra_body``)."""
    if dialect == "chat":
        async with oai(gateway) as client:
            return await client.chat.completions.create(
                model="scripted/text",
                messages=HELLO,
                extra_body=extra,
            )
    if dialect == "messages":  # max_tokens too (the SDK refuses a large one without streaming)
        async with claude(gateway) as client:
            return await client.messages.create(
                model="scripted/text", messages=HELLO, max_tokens=16, extra_body=extra
            )
    async with oai(gateway) as client:
        return await client.responses.create(model="openai/text", input="hi", extra_body=extra)


async def test_each_out_of_range_value_is_a_400_naming_it_in_its_dialect(
    keyless: Gateway,
) -> None:
    """Every row of :data:`BAD_INPUTS` through its dialect's official SDK: a 400 of type
    ``invalid_request_error`` naming the field (OpenAI's ``param``; the message in
    Anthropic's, which has no param); no provider call, nothing published. The table the
    issue's closing note gives is this test's output (``-s``)."""
    published = await keyless.published()
    rows = []
    for dialect, what, extra, field in BAD_INPUTS:
        with pytest.raises((openai.BadRequestError, anthropic.BadRequestError)) as raised:
            await sdk_call(keyless, dialect, extra)
        error: Any = raised.value
        body: dict[str, Any] = error.body  # the error's JSON (OpenAI's: the error object)
        inner = body["error"] if dialect == "messages" else body
        named = f"$.{field}" in inner["message"] if dialect == "messages" else inner["param"]
        rows.append(f"| {what} | {dialect} | {error.status_code} | {inner['type']} | {named} |")
        assert error.status_code == 400, (dialect, what)
        assert inner["type"] == "invalid_request_error", (dialect, what)
        assert named in (True, field), (dialect, what, inner)
    print("\n".join(["| input | dialect | status | type | param |", *rows]))
    assert len(keyless.scripted.received) == 0
    assert await keyless.published() == published


REPEATED = {
    "/v1/chat/completions": b'{"model": "scripted/text", "messages": [{"role": "user", '
    b'"content": "hi"}], "model": "scripted/tools"}',
    "/v1/messages": b'{"model": "scripted/text", "max_tokens": 16, "messages": [{"role": '
    b'"user", "content": "hi", "role": "assistant"}]}',
    "/v1/responses": b'{"model": "openai/text", "input": "hi", "stream": false, "stream": true}',
}


async def test_a_repeated_json_name_is_a_400_naming_it_in_each_dialect(keyless: Gateway) -> None:
    """msgspec keeps the last of a repeated name; the gateway refuses the body instead
    (a proxy or a log in front may have read the first)."""
    async with httpx.AsyncClient(base_url=keyless.url) as client:
        for path, body in REPEATED.items():
            response = await client.post(path, content=body, headers=JSON)
            assert response.status_code == 400, (path, response.text)
            kind, param = error_of(path, response)
            assert kind == "invalid_request_error"
            name = {"/v1/chat/completions": "model", "/v1/messages": "role"}.get(path, "stream")
            assert param in (name, None)
            assert f"the name {name!r} appears twice" in response.text
    assert len(keyless.scripted.received) == 0


async def test_the_gateway_is_healthy_after_bad_input(keyless: Gateway) -> None:
    for dialect, _, extra, _ in BAD_INPUTS[::4]:
        with pytest.raises((openai.BadRequestError, anthropic.BadRequestError)):
            await sdk_call(keyless, dialect, extra)
    async with httpx.AsyncClient(base_url=keyless.url) as client:
        assert (await client.get("/healthz")).status_code == 200
    ok = await sdk_call(keyless, "chat", {"max_tokens": MAX_OUTPUT_TOKENS})
    assert ok.choices[0].message.content


# -- 3. a cursor past the end; 4. one id form for Responses answers -------------------------


async def test_a_responses_answer_has_one_id_form_and_a_cursor_past_its_end_is_400(
    keyless: Gateway,
) -> None:
    """A Responses caller on a translated route (OpenAI Chat behind it) gets ``resp_`` ids,
    streamed or not (a non-streamed one was ``chatcmpl-...``); each can be retrieved; a
    ``starting_after`` past the last event is a 400 naming it, not an empty stream."""
    async with oai(keyless) as client:
        folded = await client.responses.create(model="openai/text", input="hi")
        stream = await client.responses.create(model="openai/text", input="hi", stream=True)
        events = [event async for event in stream]
        streamed_id = events[0].response.id  # type: ignore[union-attr]  # response.created
        last = events[-1].sequence_number
        for response_id in (folded.id, streamed_id):
            assert response_id.startswith("resp_tw-"), response_id
            assert (await client.responses.retrieve(response_id)).id == response_id
        again = await client.responses.retrieve(streamed_id, stream=True, starting_after=last - 1)
        assert [event.sequence_number async for event in again] == [last]
        for after in (last, last + 1, 10**6):
            with pytest.raises(openai.BadRequestError) as raised:
                await client.responses.retrieve(streamed_id, stream=True, starting_after=after)
            assert raised.value.body["param"] == "starting_after"  # type: ignore[index]
        with pytest.raises(openai.BadRequestError) as raised:  # a cursor on a folded answer
            await client.responses.retrieve(folded.id, starting_after=1)
        assert raised.value.body["param"] == "starting_after"  # type: ignore[index]


# -- 3. transport errors name the provider, not where it lives ------------------------------


async def test_a_transport_error_names_the_provider_and_keeps_its_address_in_the_log(
    nc: Client, topology: Topology, sqlite_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()  # nothing listens there
    caplog.set_level(logging.WARNING)
    nowhere = {"TOKENWIRE_OPENAI_BASE_URL": f"http://127.0.0.1:{port}/v1"}
    async with serving(nc, topology, sqlite_url, env=nowhere) as broken, oai(broken) as client:
        with pytest.raises(openai.APIStatusError) as raised:
            await client.chat.completions.create(model="openai/gpt-4o", messages=HELLO)
    text = str(raised.value.body)
    assert raised.value.status_code == 502
    assert "provider 'openai'" in text
    assert "connect_error" in text
    assert str(port) not in text
    assert "127.0.0.1" not in text
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"127.0.0.1:{port}" in logged
