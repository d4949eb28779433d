"""The demo fleet tells the plan's provider error from a request that failed unexpectedly, and
retries only the refusal a retry can cure.

The fleet runs against the real gateway on a socket, publishing to the fixtures' real
nats-server and claiming steps in its real step registry, in front of the real scripted
provider; only the broker's refusal of a chunk is the in-memory publisher configured to refuse,
because a real broker cannot be made to refuse a step deterministically.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import msgspec
import openai
import pytest
from nats.aio.client import Client

from tests.gateway._helpers import provider_env
from tokenwire.broker import MemoryPublisher, Topology
from tokenwire.cli._demo import (
    Observed,
    _checks_pass,
    _failure_lines,
    _summary_doc,
    _summary_rows,
    _verify,
)
from tokenwire.cli._fleet import (
    MESSAGE_CHARS,
    FleetPlan,
    FleetResult,
    PlannedError,
    RequestFailure,
    RetryPolicy,
    StepAt,
    classify,
    expected_totals,
    run_fleet,
)
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.services.gateway._api.edge import EdgeLimits, edge_error
from tokenwire.services.scripted_provider import ScriptedServer
from tokenwire.store import open_store

AT = StepAt("demo-x-001", 0, 0)
NO_WAIT = RetryPolicy(tries=3, max_wait_s=0.0)  # honours retry-after, capped at nothing
EDGE_MESSAGE = "the gateway is at its concurrency limit; retry shortly"


def _request() -> httpx2.Request:
    return httpx2.Request("POST", "http://gw/v1/chat/completions")


_STATUS_CLASSES: dict[int, type[openai.APIStatusError]] = {
    409: openai.ConflictError,
    429: openai.RateLimitError,
}


def _status_error(status: int, body: object, **headers: str) -> openai.APIStatusError:
    """What the SDK raises for an error answer: its class by status, the error object as body."""
    response = httpx2.Response(status, request=_request(), headers=headers)
    cls = _STATUS_CLASSES.get(status, openai.InternalServerError)
    inner = body.get("error", body) if isinstance(body, dict) else body
    return cls(f"Error code: {status}", response=response, body=inner)


def _failed(status: int | None, error: str, message: str) -> RequestFailure:
    return RequestFailure(AT.session, AT.turn, AT.step, status, error, message)


def _in_stream(message: str) -> openai.APIError:
    body = {"message": message, "type": "api_error", "param": None, "code": None}
    return openai.APIError(message, _request(), body=body)


# -- classification and the retry rule -----------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "planned", "expected"),
    [
        (_in_stream("upstream overloaded"), True, PlannedError("upstream overloaded")),
        (
            _in_stream("the broker did not acknowledge the step"),
            False,
            _failed(None, "in-stream", "the broker did not acknowledge the step"),
        ),
        (  # a planned error step the gateway refused: not the plan's error
            _status_error(503, {"error": {"message": "the broker did not accept the step"}}),
            True,
            _failed(503, "InternalServerError", "the broker did not accept the step"),
        ),
        (
            _status_error(409, {"error": {"message": "step demo-x-001/0/0 was already used"}}),
            True,
            _failed(409, "ConflictError", "step demo-x-001/0/0 was already used"),
        ),
        (  # a real provider's rate limit, relayed after the claim: the step's recorded outcome
            _status_error(
                429,
                {"error": {"message": "slow down", "code": "rate_limit_error"}},
                **{"x-tokenwire-step": "0"},
            ),
            True,
            PlannedError("slow down"),
        ),
        (  # the same where the plan allows no error
            _status_error(
                429,
                {"error": {"message": "slow down", "code": "rate_limit_error"}},
                **{"x-tokenwire-step": "0"},
            ),
            False,
            _failed(429, "RateLimitError", "slow down"),
        ),
        (  # the broker's refusal after the claim: nothing captured, never the plan's
            _status_error(
                503,
                {"error": {"message": "not captured", "code": "overloaded_error"}},
                **{"x-tokenwire-step": "0"},
            ),
            True,
            _failed(503, "InternalServerError", "not captured"),
        ),
        (
            _status_error(503, "Service Unavailable"),  # a plain-text body
            False,
            _failed(503, "InternalServerError", "Service Unavailable"),
        ),
        (
            openai.APIConnectionError(request=_request()),
            True,
            _failed(None, "APIConnectionError", "Connection error."),
        ),
        (
            openai.APITimeoutError(request=_request()),
            True,
            _failed(None, "APITimeoutError", "Request timed out."),
        ),
    ],
    ids=[
        "planned",
        "in-stream-unplanned",
        "503-at-error-step",
        "409",
        "429-recorded",
        "429-unplanned",
        "503-broker-after-claim",
        "text",
        "conn",
        "timeout",
    ],
)
def test_only_an_error_recorded_as_a_planned_steps_outcome_is_the_plans_error(
    exc: openai.APIError, planned: bool, expected: object
) -> None:
    assert classify(exc, AT, planned) == expected


def test_a_failure_keeps_a_bounded_one_line_message() -> None:
    failure = classify(_in_stream("x\n" * 1000), AT, planned=False)
    assert isinstance(failure, RequestFailure)
    assert len(failure.message) == MESSAGE_CHARS
    assert "\n" not in failure.message
    assert failure.line() == f"demo-x-001 turn 0 step 0 in-stream: {failure.message}"


def test_the_plan_puts_its_provider_error_at_one_step_and_allows_any_for_a_real_provider() -> None:
    plan = FleetPlan(sessions=3, turns=2, steps=3, run_id="x")
    planned = [
        (k, t, s)
        for k in range(3)
        for t in range(2)
        for s in range(3)
        if plan.provider_error_planned(k, t, s)
    ]
    assert planned == [(1, 0, 0)]
    assert FleetPlan(
        sessions=1, turns=1, steps=2, run_id="x", provider="openai", model="m"
    ).provider_error_planned(0, 0, 1)


def test_only_a_refusal_before_the_claim_is_retried_within_the_bound() -> None:
    policy = RetryPolicy(tries=3, max_wait_s=5.0)
    edge = _status_error(503, {"error": {"message": EDGE_MESSAGE}}, **{"retry-after": "1"})
    assert [policy.wait_s(edge, tries) for tries in (1, 2, 3)] == [1.0, 1.0, None]
    long = _status_error(503, {}, **{"retry-after": "120"})
    assert policy.wait_s(long, 1) == 5.0
    claimed = {"retry-after": "1", "x-tokenwire-step": "0"}
    assert policy.wait_s(_status_error(429, {}, **claimed), 1) is None
    assert policy.wait_s(_status_error(503, {}, **claimed), 1) is None
    assert policy.wait_s(_status_error(503, {}), 1) is None  # the registry: its claim may hold
    assert policy.wait_s(_status_error(502, {}, **{"retry-after": "1"}), 1) is None
    assert policy.wait_s(_status_error(409, {}, **{"retry-after": "1"}), 1) is None
    date = _status_error(503, {}, **{"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})
    assert policy.wait_s(date, 1) is None


# -- against the real gateway --------------------------------------------------------------


@contextlib.asynccontextmanager
async def serving(
    nc: Client, topology: Topology, sink: MemoryPublisher | None = None, **settings: Any
) -> AsyncIterator[tuple[str, ScriptedServer]]:
    """The scripted provider and the gateway in front of it (its base URL), on the real broker
    and step registry (``sink``: the chunk publisher's in-memory twin instead)."""
    async with ScriptedServer() as upstream:
        real = await broker_deps(nc, topology)
        deps = real.deps if sink is None else dataclasses.replace(real.deps, sink=sink)
        gateway = GatewaySettings(
            port=0,
            partitions=topology.partitions,
            ack_timeout_s=30.0,
            provider_env=provider_env(
                TOKENWIRE_SCRIPTED_BASE_URL=upstream.url,
                TOKENWIRE_OPENAI_BASE_URL=f"{upstream.url}/v1",
            ),
            **settings,
        )
        try:
            async with GatewayServer(gateway, deps) as server:
                yield server.url, upstream
        finally:
            await real.aclose()


def _run_id() -> str:
    return uuid.uuid4().hex[:6]


async def test_the_plans_error_step_is_a_provider_error_and_nothing_fails(
    nc: Client, topology: Topology
) -> None:
    plan = FleetPlan(
        sessions=2, turns=1, steps=2, run_id=_run_id()
    )  # session 1 meets the provider error at (0, 0)
    async with serving(nc, topology) as (url, _):
        result = await run_fleet(plan, url, retry=NO_WAIT)
    assert result.failures == []
    assert (result.provider_errors, result.unexpected_failures) == (1, 0)
    assert (result.completed_steps, result.retried_requests) == (3, 0)


async def test_a_step_the_broker_refused_fails_the_demo_checks_and_is_in_the_summary_json(
    nc: Client, topology: Topology
) -> None:
    plan = FleetPlan(sessions=2, turns=1, steps=2, run_id=_run_id())
    refusing = MemoryPublisher(fail_after=0)  # nothing is ever published: 503 before the stream
    async with serving(nc, topology, sink=refusing) as (url, _):
        result = await run_fleet(plan, url, retry=NO_WAIT)
    assert (result.unexpected_failures, result.provider_errors, result.completed_steps) == (4, 0, 0)
    assert result.retried_requests == 0  # claimed: a retry would be refused with 409
    first = next(
        f for f in result.failures if (f.session, f.turn, f.step) == (plan.session_id(1), 0, 0)
    )
    assert (first.status, first.error) == (503, "InternalServerError")
    assert first.message == "the broker did not accept the step"  # not where it lives

    expected = expected_totals(plan)
    as_planned = Observed(
        steps=expected.steps,
        messages=expected.messages,
        max_tokens_messages=expected.max_tokens_messages,
        errors=Counter({"provider": expected.errors}),
    )
    assert _checks_pass(expected, FleetResult(), as_planned)
    assert not _checks_pass(expected, result, as_planned)  # only the failures fail it
    doc = json.loads(msgspec.json.encode(_summary_doc(expected, result, as_planned)))
    assert doc["passed"] is False
    assert doc["fleet"]["unexpected_failures"] == 4
    assert dataclasses.asdict(first) in doc["fleet"]["failures"]
    assert {f["status"] for f in doc["fleet"]["failures"]} == {503}
    rows = _summary_rows(plan, expected, result, as_planned)
    assert ("requests failed unexpectedly", "4", "0") in rows
    lines = _failure_lines(result, shown=3)
    assert lines[:3] == [f.line() for f in result.failures[:3]]
    assert lines[3] == "... and 1 more (the first 4 in --summary-json)"
    assert first.line().startswith(f"{plan.session_id(1)} turn 0 step 0 503: the broker did not")


async def test_a_provider_rate_limit_relayed_after_the_claim_is_not_retried_a_retry_gets_409(
    nc: Client, topology: Topology
) -> None:
    """The gateway claims an explicit step before it calls the provider and keeps the claim
    when the call fails (the failure is the step's recorded outcome): the relayed 429 carries
    ``retry-after`` but echoes the step, so the fleet does not send it again, and counts it as
    the provider's error; sent again, the gateway answers 409."""
    plan = FleetPlan(
        sessions=1, turns=1, steps=2, run_id=_run_id(), provider="openai", model="http-429"
    )
    async with serving(nc, topology) as (url, upstream):
        result = await run_fleet(plan, url, retry=RetryPolicy(tries=3, max_wait_s=30.0))
        provider_calls = len(upstream.received)
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
        try:
            with pytest.raises(openai.ConflictError) as again:
                await client.chat.completions.create(
                    model="openai/http-429",
                    messages=[{"role": "user", "content": "again"}],
                    extra_headers=StepAt(plan.session_id(0), 0, 0).headers(),
                )
        finally:
            await client.close()
        assert len(upstream.received) == provider_calls  # the 409 cost no provider call
    # against a real provider, a failure recorded as the step's outcome is the provider's
    assert (result.provider_errors, result.unexpected_failures) == (2, 0)
    assert result.retried_requests == 0
    assert provider_calls == 2
    assert again.value.response.headers["x-should-retry"] == "false"


async def test_the_edge_refusal_is_retried_at_most_the_bound_then_recorded(
    nc: Client, topology: Topology
) -> None:
    plan = FleetPlan(sessions=1, turns=1, steps=2, run_id=_run_id())
    busy = EdgeLimits(max_requests=0)  # every request meets the concurrency limit
    async with serving(nc, topology, edge=busy) as (url, upstream):
        result = await run_fleet(plan, url, retry=NO_WAIT)
        assert len(upstream.received) == 0  # refused before the claim and the provider call
    assert result.retried_requests == 4  # two steps, three tries each
    assert [(f.step, f.status, f.message) for f in result.failures] == [
        (0, 503, EDGE_MESSAGE),
        (1, 503, EDGE_MESSAGE),
    ]


@contextlib.asynccontextmanager
async def refusing_first_connection(target_url: str) -> AsyncIterator[str]:
    """A loopback front (its URL) that answers its first connection's request with the bytes
    the gateway's edge answers at its concurrency limit, and relays every later connection to
    ``target_url``: one refusal, exactly, whatever the timing."""
    host, port = target_url.removeprefix("http://").rsplit(":", 1)
    accepted = itertools.count()
    handlers: set[asyncio.Task[Any]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.add(asyncio.current_task())  # type: ignore[arg-type]  # run as a task
        try:
            if next(accepted) == 0:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                writer.write(edge_error(503, "/v1/chat/completions", EDGE_MESSAGE))
                await writer.drain()
                return
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
            await _relay((reader, writer), (up_reader, up_writer))
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()
        async with asyncio.timeout(10):  # the caller has closed: every relay ends
            await asyncio.gather(*handlers, return_exceptions=True)


async def _relay(
    caller: tuple[asyncio.StreamReader, asyncio.StreamWriter],
    gateway: tuple[asyncio.StreamReader, asyncio.StreamWriter],
) -> None:
    """Pipe both ways until either side closes, then close both."""

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()

    tasks = {
        asyncio.create_task(pipe(caller[0], gateway[1])),
        asyncio.create_task(pipe(gateway[0], caller[1])),
    }
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        gateway[1].close()


async def test_a_step_refused_once_at_the_edge_completes_on_its_retry(
    nc: Client, topology: Topology
) -> None:
    plan = FleetPlan(sessions=2, turns=1, steps=2, run_id=_run_id())
    async with (
        serving(nc, topology) as (url, _),
        refusing_first_connection(url) as front,
    ):
        result = await run_fleet(plan, front, retry=NO_WAIT)
    assert result.failures == []
    assert (result.retried_requests, result.completed_steps, result.provider_errors) == (1, 3, 1)


async def test_a_session_the_broker_never_saw_is_a_difference_not_a_crash(
    nc: Client, topology: Topology, sqlite_url: str
) -> None:
    store = open_store(sqlite_url)
    try:
        differences = await _verify(nc, topology, store, ["demo-none-000"])
    finally:
        await store.close()
    assert differences == [
        f"demo-none-000: session 'demo-none-000' not found on the broker (stream {topology.stream})"
    ]
