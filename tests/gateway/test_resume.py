"""A dropped connection never pays twice (issue 28; docs/gateway.md, "Resuming a step").

Each caller dialect (chat, messages, responses) against each provider dialect the scripted
provider serves (OpenAI Chat, Anthropic), its connection cut at a point a seeded RNG picks
within each phase (before the first byte, mid-text, mid-tool-call, after the finish): the
official SDK then sends the same request again and must get exactly the answer it assembles
from an uninterrupted run (through a reference gateway on another topology); the scripted
provider was called once for the step; the assembler stores one message for it.
"""

from __future__ import annotations

import dataclasses
import os
import random
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec
import openai
import pytest
from nats.aio.client import Client

from tests.gateway._helpers import GATEWAY_KEY
from tests.gateway._resume_rig import (
    CALLERS,
    Case,
    Sent,
    cases,
    cut_run,
    final_answer,
    fixed_clock,
    gateway,
    openai_client,
    reference_topology,
    scripted_server,
    stored_messages,
)
from tests.gateway._resume_rig import settings_for as rig_settings
from tokenwire.broker import Topology, connect
from tokenwire.schemas import MessageEvent
from tokenwire.services.gateway import GatewayServer, broker_deps

SEED = int(os.environ.get("RESUME_SEED", random.randrange(1 << 32)))


@pytest.mark.parametrize("caller", CALLERS)
async def test_a_cut_step_retried_with_the_sdk_resumes_without_a_second_call(
    caller: str, nc: Client, topology: Topology, nats_url: str, tmp_path: Path
) -> None:
    print(f"RESUME_SEED={SEED}")
    clock = fixed_clock()
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    checked: list[Case] = []
    async with (
        scripted_server() as scripted,
        reference_topology(nc) as ref_topology,
        gateway(nc, ref_topology, scripted.url, clock) as reference,
        gateway(nc, topology, scripted.url, clock) as url,
    ):
        for case in cases(caller, SEED):
            sent = Sent()
            expected = await final_answer(reference, case, sent)
            before = len(scripted.received)
            await cut_run(url, case, sent.bodies[-1])
            assert len(scripted.received) == before + 1, case
            resumed = await final_answer(url, case, Sent())
            assert resumed == expected, case
            assert len(scripted.received) == before + 1, f"{case}: a second provider call"
            checked.append(case)
    for case in checked:
        rows = await stored_messages(nats_url, topology, store_url, case.session)
        assert [(type(r), r.turn, r.step) for r in rows] == [(MessageEvent, 0, 0)], case


@pytest.mark.parametrize("caller", CALLERS)
async def test_a_cut_step_resumes_on_another_gateway_after_a_restart(
    caller: str, nc: Client, topology: Topology
) -> None:
    """The gateway that served the cut request stops (a rolling restart: its running steps
    finish first); a new gateway instance on the same broker serves the SDK's retry."""
    print(f"RESUME_SEED={SEED}")
    clock = fixed_clock()
    rng = random.Random(SEED)
    async with (
        scripted_server() as scripted,
        reference_topology(nc) as ref_topology,
        gateway(nc, ref_topology, scripted.url, clock) as reference,
    ):
        for case in rng.sample(cases(caller, SEED), 4):  # each restart costs two gateways
            sent = Sent()
            expected = await final_answer(reference, case, sent)
            before = len(scripted.received)
            async with gateway(nc, topology, scripted.url, clock) as first:
                await cut_run(first, case, sent.bodies[-1])
            async with gateway(nc, topology, scripted.url, clock) as second:
                resumed = await final_answer(second, case, Sent())
            assert resumed == expected, case
            assert len(scripted.received) == before + 1, f"{case}: a second provider call"


SLOW = "text?rate=20"  # 12 fragments at 20 a second: a step that runs for about 0.6 s
SLOW_BODY: dict[str, Any] = {
    "model": f"openai/{SLOW}",
    "messages": [{"role": "user", "content": "x"}],
    "stream": True,
}


async def test_a_step_whose_gateway_died_is_answered_abandoned_never_called_again(
    nc: Client, topology: Topology, nats_url: str
) -> None:
    """The first gateway loses the broker for good mid-step (as a crash would: nothing more
    of the step is stored, not even an ``aborted`` finish). The retry on another gateway gets
    what was stored, then, once nothing came for its idle bound, the dialect's error naming
    the abandoned step; the provider is never called again for it."""
    clock = fixed_clock()
    case = cases("chat", SEED)[0]
    body = SLOW_BODY
    async with scripted_server() as scripted:
        own = await connect(nats_url)
        real = await broker_deps(own, topology)
        settings = rig_settings(scripted.url, topology)
        async with GatewayServer(settings, real.deps) as first:
            await cut_run(first.url, case, msgspec.json.encode(body))
            await own.close()  # the step can publish nothing more: its gateway is as dead
        await real.aclose()
        sent = len(scripted.received)
        # abandoned after 1 s
        quick: dict[str, Any] = {"max_step_idle_seconds": 0.5, "ack_timeout_s": 0.5}
        async with (
            gateway(nc, topology, scripted.url, clock, **quick) as second,
            openai_client(second, Sent()) as oa,
        ):
            stream = await oa.chat.completions.create(**body, extra_headers=case.headers)
            with pytest.raises(openai.APIError, match="abandoned"):
                async for _ in stream:
                    pass
        assert len(scripted.received) == sent


DAY_NS = 86_400 * 10**9


def a_day_later() -> int:
    """The broker's clock a day after now: every claim made now is a day old."""
    return time.time_ns() + DAY_NS


async def test_past_the_streams_retention_a_retried_step_is_410_never_called_again(
    nc: Client, topology: Topology
) -> None:
    """Past the bound of how long a step can be resumed (docs/gateway.md, "Resuming a
    step"): a retry a day after the claim still resumes while the stream holds the step's
    chunks; once retention removed them (here purged from the real stream by the session's
    subjects, as ``max_age`` or ``max_bytes`` would), the same retry is a 410 in its
    dialect with ``x-should-retry: false``, and the provider is never called again."""
    case = cases("chat", SEED)[2]
    clock = fixed_clock()  # the same ``created`` on every gateway
    async with scripted_server() as scripted:
        first = await final_answer_on(nc, topology, scripted.url, case, clock, time.time_ns)
        calls = len(scripted.received)
        again = await final_answer_on(nc, topology, scripted.url, case, clock, a_day_later)
        assert again == first  # still retained: resumed
        js = nc.jetstream()
        stream = topology.stream_of(case.session)
        await js.purge_stream(stream, subject=topology.session_filter(case.session))
        with pytest.raises(openai.APIStatusError) as gone:
            await final_answer_on(nc, topology, scripted.url, case, clock, a_day_later)
        assert len(scripted.received) == calls == 1
    assert gone.value.status_code == 410
    assert "no longer retained" in gone.value.message
    assert gone.value.response.headers["x-should-retry"] == "false"


async def final_answer_on(
    nc: Client, topology: Topology, scripted_url: str, case: Case, clock: Any, broker_clock: Any
) -> dict[str, Any]:
    """The case's answer from a fresh gateway whose broker clock is ``broker_clock``."""
    real = await broker_deps(nc, topology)
    deps = dataclasses.replace(real.deps, clock_ns=clock, broker_clock_ns=broker_clock)
    try:
        async with GatewayServer(rig_settings(scripted_url, topology), deps) as server:
            return await final_answer(server.url, case, Sent())
    finally:
        await real.aclose()


async def test_resumers_past_the_cap_get_429_with_retry_after(
    nc: Client, topology: Topology
) -> None:
    """``max_resumers`` callers may follow one step at once on a gateway; the next gets 429
    with ``retry-after`` (the SDKs wait and retry), and one gets in once another left."""
    case = cases("chat", SEED)[1]
    body = msgspec.json.encode(SLOW_BODY)
    headers = {
        **case.headers,
        "authorization": f"Bearer {GATEWAY_KEY}",
        "content-type": "application/json",
    }
    async with (
        scripted_server() as scripted,
        gateway(nc, topology, scripted.url, fixed_clock(), max_resumers=1) as url,
        httpx.AsyncClient(timeout=30) as client,
    ):
        path = url + "/v1/chat/completions"
        first = await client.send(
            client.build_request("POST", path, content=body, headers=headers), stream=True
        )
        await first.aclose()  # cut at once: the step reads on
        holder = await client.send(
            client.build_request("POST", path, content=body, headers=headers), stream=True
        )
        assert holder.headers["x-tokenwire-resumed"] == "true"
        refused = await client.post(path, content=body, headers=headers)
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert "x-should-retry" not in refused.headers
        assert refused.json()["error"]["type"] == "rate_limit_error"
        await holder.aread()
        await holder.aclose()
        again = await client.post(path, content=body, headers=headers)
        assert again.status_code == 200
        assert again.text.endswith("data: [DONE]\n\n")
        assert len(scripted.received) == 1


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_the_openai_sdk_resumes_a_responses_stream_with_starting_after(
    provider: str, nc: Client, topology: Topology
) -> None:
    """``client.responses.retrieve(id, stream=True, starting_after=N)`` after a stream was
    dropped at event N: the events before and after together are exactly the uninterrupted
    run's (the same ``sequence_number``s); ``retrieve(id)`` is its final response. An
    assigned step (no tokenwire headers): every Responses answer can be retrieved."""
    print(f"RESUME_SEED={SEED}")
    rng = random.Random(SEED)
    clock = fixed_clock()
    model = f"{provider}/tools"
    async with (
        scripted_server() as scripted,
        reference_topology(nc) as ref_topology,
        gateway(nc, ref_topology, scripted.url, clock) as reference,
        gateway(nc, topology, scripted.url, clock) as url,
        openai_client(reference, Sent()) as ref_client,
        openai_client(url, Sent()) as client,
    ):
        session = {"x-tokenwire-session": f"retrieve-{rng.randrange(1 << 30)}-{provider}"}
        whole = [
            e.model_dump()
            async for e in await ref_client.responses.create(
                model=model, input="resume me", stream=True, extra_headers=session
            )
        ]
        cut_at = rng.randrange(2, len(whole) - 2)
        before = len(scripted.received)
        seen = []
        async for event in await client.responses.create(
            model=model, input="resume me", stream=True, extra_headers=session
        ):
            seen.append(event.model_dump())
            if event.sequence_number == cut_at:
                break  # the connection goes
        response_id = seen[0]["response"]["id"]
        rest = [
            e.model_dump()
            async for e in await client.responses.retrieve(
                response_id, stream=True, starting_after=cut_at
            )
        ]
        final = await client.responses.retrieve(response_id)
    assert seen + rest == whole, f"cut after sequence_number {cut_at}"
    assert final.model_dump() == whole[-1]["response"]
    assert len(scripted.received) == before + 1


async def test_the_sdks_own_retry_with_an_idempotency_key_resumes_the_step(
    nc: Client, topology: Topology
) -> None:
    """A non-streaming call times out before its (slow) step ends; the openai SDK retries on
    its own (``x-stainless-retry-count`` changes, the body and the ``Idempotency-Key`` do not)
    and gets the step's answer from the broker: one provider call, no turn or step named.
    Neither official SDK sends an ``Idempotency-Key`` by default: the caller names one."""
    clock = fixed_clock()
    session = {"x-tokenwire-session": f"idem-{random.Random(SEED).randrange(1 << 30)}"}
    keyed = {**session, "Idempotency-Key": "agent-7-call-1"}
    slow = {"model": SLOW_BODY["model"], "messages": SLOW_BODY["messages"]}
    async with (
        scripted_server() as scripted,
        reference_topology(nc) as ref_topology,
        gateway(nc, ref_topology, scripted.url, clock) as reference,
        gateway(nc, topology, scripted.url, clock) as url,
        openai_client(reference, Sent()) as ref_client,
        openai_client(url, sent := Sent(), retries=4) as client,
    ):
        expected = await ref_client.chat.completions.create(**slow, extra_headers=keyed)
        before = len(scripted.received)
        impatient = client.with_options(timeout=0.25)
        answer = await impatient.chat.completions.create(**slow, extra_headers=keyed)
        assert len(sent.bodies) >= 2  # timed out at least once, then retried by the SDK
        assert len(scripted.received) == before + 1
        with pytest.raises(openai.ConflictError, match="same Idempotency-Key"):
            await client.chat.completions.create(
                model=slow["model"],
                messages=[{"role": "user", "content": "else"}],
                extra_headers=keyed,
            )
    assert answer.model_dump() == expected.model_dump()
    assert answer.id.startswith("chatcmpl-")
