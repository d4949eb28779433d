"""``GET /v1/responses/{id}`` (the openai SDK's ``responses.retrieve``) for a step the broker
no longer retains: read from the store's chunk log, folded or streamed again, marked
``x-tokenwire-source: store`` (a real gateway, nats-server and SQLite store; the session's
chunks purged by subject). Ground truth: the answer the caller got the first time."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.gateway._helpers import GATEWAY_KEY
from tests.gateway._threading_rig import threading_stack
from tests.replay.sessions import commit_folded
from tokenwire.replay import read_session
from tokenwire.store import open_store


@pytest.fixture
async def store(sqlite_url):
    opened = open_store(sqlite_url)
    try:
        yield opened
    finally:
        await opened.close()


async def test_a_response_gone_from_the_broker_is_retrieved_from_the_store(
    nats_url, nc, topology, store
) -> None:
    async with threading_stack(nats_url, nc, topology, store=store) as stack:
        client = openai.AsyncOpenAI(base_url=stack.urls[0] + "/v1", api_key=GATEWAY_KEY)
        raw: Any = await client.responses.with_raw_response.create(
            model="scripted/text", input="tell me something"
        )
        first = raw.parse()
        session = raw.headers["x-tokenwire-session"]
        sent = [e.envelope async for e in read_session(nc, topology, session)]
        await commit_folded(store, sent)  # what the assembler does
        await nc.jetstream().purge_stream(topology.stream, subject=topology.session_filter(session))
        assert [e async for e in read_session(nc, topology, session)] == []

        again: Any = await client.responses.with_raw_response.retrieve(first.id)
        streamed = await client.responses.retrieve(first.id, stream=True)
        text = ""
        async for event in streamed:
            if event.type == "response.output_text.delta":
                text += event.delta
        await client.close()
    assert again.headers["x-tokenwire-source"] == "store"
    assert again.parse().output_text == first.output_text
    assert text == first.output_text
