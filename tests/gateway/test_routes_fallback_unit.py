"""Fallbacks before the first byte, through the gateway app on in-memory seams (canned
provider answers, the broker's twins): a routed step whose first call fails is served by the
next deployment under one step identity, its first chunk names the deployment and the failed
attempt; a failure after the first chunk and a caller's 400 are not retried; a fallback to
another dialect is translated, or skipped (never a field dropped silently); no deployment left
is a 429. Expected content comes from the recordings through the official SDKs (the oracles).
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from opentelemetry import metrics
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.gateway._helpers import (
    GATEWAY_KEY,
    Rig,
    anthropic_oracle,
    collect_openai,
    make_rig,
    openai_oracle,
    recording,
)
from tokenwire.observability import OtelProviders
from tokenwire.providers import ProviderHTTPError
from tokenwire.schemas import ChunkEnvelope, Finish, Routed
from tokenwire.services.gateway._routing.routes_file import parse_routes
from tokenwire.services.gateway._routing.routing import Route

OPENAI_TEXT = "openai/chat-text-include-usage.sse"
ANTHROPIC_TEXT = "anthropic/messages-text-short.sse"
ROUTES = b"""
[[models]]
name = "gpt-4o"
fallbacks = ["claude"]
  [[models.deployments]]
  name = "bad"
  provider = "openai"
  model = "gpt-4o"
  base_url = "http://bad.invalid/v1"
  weight = 1000000
  [[models.deployments]]
  name = "good"
  provider = "openai"
  model = "gpt-4o-2024-08-06"
  base_url = "http://good.invalid/v1"
  weight = 0.000001
  price = { input = 2.5, output = 10 }

[[models]]
name = "claude"
  [[models.deployments]]
  name = "claude-main"
  provider = "anthropic"
  model = "claude-sonnet-4-5"
  base_url = "http://claude.invalid"
"""
ENV = {"ANTHROPIC_API_KEY": "sk-ant-SENTINEL-5e6f7a8b"}


def _rig(answers: dict[str, Any], **settings: Any) -> Rig:
    """A gateway whose provider answers by host (``bad``, ``good``, ``claude``)."""
    return _rig_of(ROUTES, answers, **settings)


def _rig_of(routes: bytes, answers: dict[str, Any], **settings: Any) -> Rig:
    """A gateway with ``routes`` whose provider answers by host."""

    def answer(route: Route, body: bytes) -> Any:
        host = route.url.split("//", 1)[1].split(".", 1)[0]
        return answers[host]

    table = parse_routes(routes, ENV, "routes.toml")
    return make_rig(answer, routes=table, routes_env=ENV, **settings)


def _first(rig: Rig) -> ChunkEnvelope:
    [first] = [e for e in rig.envelopes() if e.ordinal == 0]
    assert isinstance(first, ChunkEnvelope)
    return first


def _routed(rig: Rig) -> Routed:
    routed = _first(rig).routed
    assert isinstance(routed, Routed)
    return routed


async def test_a_5xx_falls_back_to_the_next_deployment_under_one_step() -> None:
    body = recording(OPENAI_TEXT)
    rig = _rig({"bad": ProviderHTTPError(500, "boom", retryable=True), "good": body})
    client = rig.openai()
    stream = await client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    got = await collect_openai(stream)
    expected = await openai_oracle(body)
    assert got["text"] == expected["text"]
    assert got["finish"] == expected["finish"]
    assert [r.url for r, _ in rig.upstream.requests] == [
        "http://bad.invalid/v1/chat/completions",
        "http://good.invalid/v1/chat/completions",
    ]
    first = _first(rig)
    assert (first.provider, first.model) == ("openai", "gpt-4o-2024-08-06")
    routed = _routed(rig)
    assert (routed.route, routed.deployment) == ("gpt-4o", "good")
    assert [(a.deployment, a.failure, a.status) for a in routed.attempts] == [
        ("bad", "server-error", 500)
    ]
    assert routed.price is not None
    assert routed.price.input_pusd == 2_500_000
    # one step: every chunk of the answer under one (session, turn, step)
    assert len({(e.session, e.turn, e.step) for e in rig.envelopes()}) == 1
    assert rig.steps.claimed == {(first.session, first.turn, first.step)}


async def test_a_connection_refused_before_the_first_byte_falls_back() -> None:
    body = recording(OPENAI_TEXT)
    refused = b'data: {"error": {"message": "connection refused", "code": "connect_error"}}\n\n'
    rig = _rig({"bad": refused, "good": body})
    response = await rig.client(authorization=f"Bearer {GATEWAY_KEY}").post(
        "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 200, response.text
    assert _routed(rig).deployment == "good"
    assert [a.failure for a in _routed(rig).attempts] == ["connect"]


async def test_a_failure_after_the_first_chunk_is_never_retried() -> None:
    body = recording(OPENAI_TEXT)
    at = body.index(b'"delta":{"content":"')  # the first chunk with content
    cut = body[: body.index(b"\n\n", at) + 2]  # then the connection ends
    rig = _rig({"bad": cut, "good": body})
    client = rig.openai()
    stream = await client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    with pytest.raises(openai.APIError, match="stream ended"):
        await collect_openai(stream)
    assert len(rig.upstream.requests) == 1
    routed = _routed(rig)
    assert (routed.deployment, routed.attempts) == ("bad", [])
    last = rig.envelopes()[-1].chunk
    assert isinstance(last, Finish)
    assert last.error is not None


async def test_a_caller_error_from_the_provider_is_the_answer() -> None:
    rig = _rig({"bad": ProviderHTTPError(400, "bad request", retryable=False), "good": b""})
    response = await rig.client(authorization=f"Bearer {GATEWAY_KEY}").post(
        "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 400
    assert len(rig.upstream.requests) == 1
    assert _routed(rig).deployment == "bad"


async def test_an_openai_caller_falls_back_to_an_anthropic_group_translated() -> None:
    body = recording(ANTHROPIC_TEXT)
    down = ProviderHTTPError(503, "overloaded", retryable=True)
    rig = _rig({"bad": down, "good": down, "claude": body})
    client = rig.openai()
    stream = await client.chat.completions.create(
        model="gpt-4o",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        max_tokens=50,
        temperature=0.2,
    )
    got = await collect_openai(stream)
    expected = await anthropic_oracle(body)
    assert got["text"] == "".join(b.text for b in expected.content if b.type == "text")
    route, sent = rig.upstream.requests[-1]
    assert route.url == "http://claude.invalid/v1/messages"
    translated = json.loads(sent)
    assert translated["model"] == "claude-sonnet-4-5"
    assert translated["max_tokens"] == 50
    assert translated["temperature"] == 0.2
    routed = _routed(rig)
    assert routed.deployment == "claude-main"
    assert [a.deployment for a in routed.attempts] == ["bad", "good"]
    assert _first(rig).provider == "anthropic"


async def test_a_fallback_that_would_drop_a_field_is_skipped_not_used_silently() -> None:
    down = ProviderHTTPError(503, "overloaded", retryable=True)
    rig = _rig({"bad": down, "good": down, "claude": recording(ANTHROPIC_TEXT)})
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "seed": 7}
    response = await rig.client(authorization=f"Bearer {GATEWAY_KEY}").post(
        "/v1/chat/completions", json=body
    )
    assert response.status_code == 503
    assert "x-tokenwire-dropped-params" not in response.headers
    assert all("claude" not in r.url for r, _ in rig.upstream.requests)
    routed = _routed(rig)
    assert routed.deployment == "good"
    [bad, skipped] = routed.attempts
    assert (bad.deployment, skipped.deployment, skipped.failure) == (
        "bad",
        "claude-main",
        "untranslatable",
    )
    assert "seed" in skipped.message


async def test_with_the_drop_opt_in_the_fallback_is_used_and_says_what_it_dropped() -> None:
    down = ProviderHTTPError(503, "overloaded", retryable=True)
    rig = _rig({"bad": down, "good": down, "claude": recording(ANTHROPIC_TEXT)})
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "seed": 7}
    response = await rig.client(
        authorization=f"Bearer {GATEWAY_KEY}", **{"x-tokenwire-drop-params": "true"}
    ).post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.headers["x-tokenwire-dropped-params"] == "seed"
    assert _routed(rig).deployment == "claude-main"


async def test_every_deployment_cooling_down_is_a_429_with_retry_after() -> None:
    limited = ProviderHTTPError(429, "slow down", retryable=True, headers={"retry-after": "30"})
    rig = _rig({"bad": limited, "good": limited, "claude": limited})
    client = rig.client(authorization=f"Bearer {GATEWAY_KEY}")
    request = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    first = await client.post("/v1/chat/completions", json=request)
    assert first.status_code == 429
    assert len(rig.upstream.requests) == 3
    again = await client.post("/v1/chat/completions", json=request)
    assert again.status_code == 429
    assert 1 <= int(again.headers["retry-after"]) <= 30
    assert "no deployment of 'gpt-4o'" in again.json()["error"]["message"]
    assert len(rig.upstream.requests) == 3  # nothing more was sent


async def test_provider_slash_model_is_untouched_by_a_routes_file() -> None:
    body = recording(OPENAI_TEXT)
    rig = _rig({"api": body})
    response = await rig.client(authorization=f"Bearer {GATEWAY_KEY}").post(
        "/v1/chat/completions",
        json={"model": "openai/gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 200, response.text
    assert _first(rig).routed is not None
    assert not isinstance(_first(rig).routed, Routed)


async def test_the_model_list_names_the_public_models_first() -> None:
    rig = _rig({})
    response = await rig.client(authorization=f"Bearer {GATEWAY_KEY}").get("/v1/models")
    ids = [m["id"] for m in response.json()["data"]]
    assert ids[:2] == ["gpt-4o", "claude"]


async def test_no_first_token_within_the_bound_falls_back() -> None:
    body = recording(OPENAI_TEXT)
    routes = ROUTES.replace(b'name = "gpt-4o"\n', b'name = "gpt-4o"\nfirst_byte_timeout_s = 0.2\n')
    rig = make_rig(
        lambda route, _: body,
        routes=parse_routes(routes, ENV, "routes.toml"),
        routes_env=ENV,
    )
    send = rig.upstream.send

    def slow_bad(route: Route, sent: bytes) -> Any:
        call = send(route, sent)
        if "bad" in route.url:
            call.pause_s = 30.0  # nothing for 30 s: past the 0.2 s bound
        return call

    rig.upstream.send = slow_bad  # type: ignore[method-assign,assignment]
    response = await rig.client(authorization=f"Bearer {GATEWAY_KEY}").post(
        "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 200, response.text
    routed = _routed(rig)
    assert routed.deployment == "good"
    [late] = routed.attempts
    assert (late.deployment, late.failure) == ("bad", "timeout")
    assert "0.2 s" in late.message


async def test_metrics_count_each_deployment_call_and_show_its_state() -> None:
    limited = ProviderHTTPError(429, "slow down", retryable=True, headers={"retry-after": "30"})
    rig = _rig({"bad": limited, "good": recording(OPENAI_TEXT)})
    client = rig.client(authorization=f"Bearer {GATEWAY_KEY}")
    request = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    assert (await client.post("/v1/chat/completions", json=request)).status_code == 200
    text = (await client.get("/metrics")).text
    calls = 'tokenwire_gateway_deployment_calls_total{deployment="%s",outcome="%s",route="gpt-4o"}'
    assert calls % ("bad", "rate-limited") + " 1.0" in text
    assert calls % ("good", "ok") + " 1.0" in text
    assert 'tokenwire_gateway_fallbacks_total{route="gpt-4o"} 1.0' in text
    state = 'tokenwire_gateway_deployment_state{deployment="%s",state="%s"} 1.0'
    assert state % ("bad", "cooling") in text
    assert state % ("good", "ok") in text
    assert state % ("claude-main", "ok") in text


async def test_the_call_span_names_the_route_the_deployment_and_each_failed_attempt() -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    otel = OtelProviders(metrics.NoOpMeterProvider(), tracer_provider, sdk=True)
    down = ProviderHTTPError(503, "overloaded", retryable=True)
    answers = {"bad": down, "good": recording(OPENAI_TEXT)}

    def answer(route: Route, body: bytes) -> Any:
        return answers[route.url.split("//", 1)[1].split(".", 1)[0]]

    rig = make_rig(
        answer, otel=otel, routes=parse_routes(ROUTES, ENV, "routes.toml"), routes_env=ENV
    )
    response = await rig.client(authorization=f"Bearer {GATEWAY_KEY}").post(
        "/v1/chat/completions",
        json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert response.status_code == 200
    [span] = exporter.get_finished_spans()
    attributes = span.attributes or {}
    assert attributes["tokenwire.route"] == "gpt-4o"
    assert attributes["tokenwire.deployment"] == "good"
    assert attributes["tokenwire.attempts"] == 2
    [event] = [e for e in span.events if e.name == "tokenwire.attempt_failed"]
    assert dict(event.attributes or {}) == {
        "tokenwire.deployment": "bad",
        "tokenwire.failure": "server-error",
        "http.response.status_code": 503,
    }


SPARE = b"""
[[models]]
name = "spare"
  [[models.deployments]]
  name = "spare-main"
  provider = "openai"
  model = "gpt-4o-mini"
  base_url = "http://spare.invalid/v1"
"""


async def test_a_first_pick_that_cannot_carry_the_request_is_skipped_as_a_fallback_is() -> None:
    """While the group cools down a request's first pick is a fallback of another dialect; when
    it cannot carry a field of the request it is recorded ``untranslatable`` and the next
    fallback serves the step, as when a failure reached it (before: the caller got a 400 for
    the field although the fallback of its own dialect after it was healthy)."""
    routes = ROUTES.replace(b'fallbacks = ["claude"]', b'fallbacks = ["claude", "spare"]')
    limited = ProviderHTTPError(429, "slow down", retryable=True, headers={"retry-after": "30"})
    rig = _rig_of(
        routes + SPARE,
        {
            "bad": limited,
            "good": limited,
            "claude": recording(ANTHROPIC_TEXT),
            "spare": recording(OPENAI_TEXT),
        },
    )
    client = rig.client(authorization=f"Bearer {GATEWAY_KEY}")
    hi = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    cooled = await client.post("/v1/chat/completions", json=hi)  # bad and good: 429, 30 s
    assert cooled.status_code == 200, cooled.text
    sent = len(rig.upstream.requests)
    response = await client.post("/v1/chat/completions", json={**hi, "seed": 7})
    assert response.status_code == 200, response.text
    assert [r.url for r, _ in rig.upstream.requests[sent:]] == [
        "http://spare.invalid/v1/chat/completions"
    ]
    first = [e for e in rig.envelopes() if e.ordinal == 0][-1]
    assert isinstance(first, ChunkEnvelope)
    assert isinstance(first.routed, Routed)
    assert first.routed.deployment == "spare-main"
    [skipped] = first.routed.attempts
    assert (skipped.deployment, skipped.failure) == ("claude-main", "untranslatable")
    assert "seed" in skipped.message
    text = (await client.get("/metrics")).text
    flying = 'tokenwire_gateway_deployment_in_flight{deployment="%s"} 0.0'
    assert all(flying % d in text for d in ("bad", "good", "claude-main", "spare-main"))
    calls = 'tokenwire_gateway_deployment_calls_total{deployment="%s",outcome="%s",route="gpt-4o"}'
    assert calls % ("claude-main", "untranslatable") + " 1.0" in text
