"""The gateway, the telemetry consumer and the assembler exporting OTLP/HTTP to a receiver in
the test.

Real parts: nats-server with JetStream, the gateway on a socket, the scripted provider and the
real provider recordings served over sockets as upstreams, the SDK's OTLP/HTTP exporters, and a
receiver decoding the protobuf wire format (opentelemetry-proto). Ground truth: the callers'
``traceparent`` values, the usage in the recordings (read here with ``json``), and the scripted
provider's error codes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.assembler.harness import settings_for
from tests.fixtures.recordings import recordings_dir
from tests.observability._otlp import (
    SPAN_KIND_CLIENT,
    STATUS_ERROR,
    OtlpReceiver,
    attributes,
)
from tests.providers.conftest import RecordingServer, Route
from tokenwire.observability import OtelProviders, conventions, otel_from_env
from tokenwire.services.assembler import run as run_assembler
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.services.scripted_provider import ScriptedServer, ScriptedSettings
from tokenwire.services.telemetry import OtelSignals, TelemetryConsumer, TelemetryMetrics

ANSWER_SENTINEL = "SENTINEL-ANSWER-5a1f"
PROMPT_SENTINEL = "SENTINEL-PROMPT-9c2e"
KEY_SENTINEL = "sk-SENTINEL-KEY-77aa"
SCRIPTED = ScriptedSettings(seed=5, length=6, sentinel=ANSWER_SENTINEL)
DEEPSEEK = "deepseek/chat-reasoning-tool-call-cache-hit.sse"
ANTHROPIC = "anthropic/messages-prompt-cache-write.sse"


@dataclass(frozen=True)
class Call:
    dialect: str
    model: str
    outcome: str  # "ok", or the error.type the scripted provider's failure gives
    started: bool = True  # whether the first chunk is content (not an error)


CALLS = [
    Call("openai", "scripted/text", "ok"),
    Call("anthropic", "scripted/reasoning", "ok"),
    # The scripted provider's rate-limit failure: OpenAI code rate_limit_exceeded, HTTP 429.
    Call("openai", "scripted/http-429", "rate_limit_exceeded", started=False),
    # Its in-band failure after content: Anthropic type overloaded_error.
    Call("anthropic", "scripted/error", "overloaded_error"),
    Call("openai", "deepseek/deepseek-reasoner", "ok"),
    Call("anthropic", "anthropic/claude-3-5-sonnet-20240620", "ok"),
]


def _recorded_usage(name: str) -> dict[str, int]:
    """The usage a recording reports, in the conventions' terms (input includes cached tokens,
    output includes reasoning), read with json independently of tokenwire's adapters."""
    events = [
        json.loads(line[5:])
        for line in (recordings_dir() / name).read_text().splitlines()
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]")
    ]
    if name.startswith("deepseek"):
        usage = next(e["usage"] for e in events if e.get("usage"))
        return {
            "input": usage["prompt_tokens"],
            "output": usage["completion_tokens"],
            "cache_read": usage["prompt_cache_hit_tokens"],
            "reasoning": usage["completion_tokens_details"]["reasoning_tokens"],
        }
    start = next(e for e in events if e["type"] == "message_start")["message"]["usage"]
    delta = [e for e in events if e["type"] == "message_delta"][-1]["usage"]
    cached = start["cache_creation_input_tokens"] + start["cache_read_input_tokens"]
    return {
        "input": start["input_tokens"] + cached,
        "output": delta["output_tokens"],
        "cache_write": start["cache_creation_input_tokens"],
        "cache_read": start["cache_read_input_tokens"],
    }


def _recorded_head(name: str) -> tuple[str, str]:
    """The response id and model a recording names its answer with (read with json)."""
    lines = (recordings_dir() / name).read_text().splitlines()
    first = json.loads(next(line[5:] for line in lines if line.startswith("data:")))
    head = first["message"] if name.startswith("anthropic") else first
    return head["id"], head["model"]


def _traceparents(n: int) -> list[tuple[str, str]]:
    rng = random.Random(17)
    return [(f"{rng.getrandbits(128):032x}", f"{rng.getrandbits(64):016x}") for _ in range(n)]


async def _call(client: httpx.AsyncClient, call: Call, i: int, tp: tuple[str, str]) -> int:
    body: dict[str, Any] = {
        "model": call.model,
        "messages": [{"role": "user", "content": f"{PROMPT_SENTINEL} question {i}"}],
        "stream": True,
    }
    path = "/v1/chat/completions" if call.dialect == "openai" else "/v1/messages"
    if call.dialect == "anthropic":
        body["max_tokens"] = 100
    headers = {"traceparent": f"00-{tp[0]}-{tp[1]}-01", "x-tokenwire-session": f"obs-{i}"}
    async with client.stream("POST", path, json=body, headers=headers) as response:
        await response.aread()
    return response.status_code


def _settings(scripted_url: str, upstream: str, partitions: int) -> GatewaySettings:
    return GatewaySettings(
        port=0,
        provider_env={
            "TOKENWIRE_SCRIPTED_BASE_URL": scripted_url,
            "TOKENWIRE_DEEPSEEK_BASE_URL": f"{upstream}/v1",
            "DEEPSEEK_API_KEY": KEY_SENTINEL,
            "TOKENWIRE_ANTHROPIC_BASE_URL": upstream,
            "ANTHROPIC_API_KEY": KEY_SENTINEL,
        },
        partitions=partitions,
        ack_timeout_s=10.0,
    )


async def _through_the_gateway(
    nc: Any, topology: Any, otel: OtelProviders, tps: list[tuple[str, str]]
) -> tuple[list[int], str]:
    """Every call of CALLS through a real gateway; the statuses and the /metrics text."""
    recordings = RecordingServer()
    await recordings.start()
    recordings.serve("/v1/chat/completions", Route((recordings_dir() / DEEPSEEK).read_bytes(), []))
    recordings.serve("/v1/messages", Route((recordings_dir() / ANTHROPIC).read_bytes(), []))
    upstream = f"http://127.0.0.1:{recordings.port}"
    real = await broker_deps(nc, topology, otel=otel)
    try:
        async with (
            ScriptedServer(SCRIPTED) as scripted,
            GatewayServer(_settings(scripted.url, upstream, topology.partitions), real.deps) as gw,
            httpx.AsyncClient(base_url=gw.url, timeout=30) as client,
        ):
            calls = enumerate(zip(CALLS, tps, strict=True))
            statuses = [await _call(client, c, i, tp) for i, (c, tp) in calls]
            return statuses, (await client.get("/metrics")).text
    finally:
        await real.aclose()
        await recordings.stop()


@pytest.mark.slow
async def test_one_client_span_per_call_tokens_errors_and_no_content(
    nc, topology, nats_url, sqlite_url, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="tokenwire")
    tps = _traceparents(len(CALLS))
    with OtlpReceiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}
        gw_otel = otel_from_env("tokenwire-gateway", {**env, "OTEL_SERVICE_NAME": "gw-test"})
        tel_otel = otel_from_env("tokenwire-telemetry", env)
        asm_otel = otel_from_env("tokenwire-assembler", env)
        metrics = TelemetryMetrics()
        try:
            statuses, prometheus = await _through_the_gateway(nc, topology, gw_otel, tps)
            signals = OtelSignals(tel_otel.tracer_provider)
            consumer = TelemetryConsumer(nc=nc, topology=topology, metrics=metrics, otel=signals)
            await asyncio.wait_for(consumer.run(asyncio.Event(), burst=True), 60)
            settings = settings_for(nats_url, topology, sqlite_url)
            await asyncio.wait_for(run_assembler(settings, otel=asm_otel), 60)
            for otel in (gw_otel, tel_otel, asm_otel):
                await asyncio.to_thread(otel.force_flush)
        finally:
            for otel in (gw_otel, tel_otel, asm_otel):
                otel.shutdown()

    assert statuses == [200, 200, 429, 200, 200, 200]
    spans = receiver.received.spans()
    client_spans = {s.trace_id.hex(): (svc, s) for svc, s in spans if s.kind == SPAN_KIND_CLIENT}
    assert len([s for _, s in spans if s.kind == SPAN_KIND_CLIENT]) == len(CALLS)
    for call, (trace_id, parent_id) in zip(CALLS, tps, strict=True):
        service, span = client_spans[trace_id]
        assert service == "gw-test"  # OTEL_SERVICE_NAME, not a hard-coded name
        assert span.parent_span_id.hex() == parent_id
        _check_client_span(call, span)
    _check_consumer_spans(spans, client_spans, tps)
    _check_assembler_spans(spans, client_spans, tps)
    _check_metrics(receiver, prometheus, metrics)
    for raw in [*receiver.received.raw, prometheus.encode(), caplog.text.encode()]:
        for sentinel in (ANSWER_SENTINEL, PROMPT_SENTINEL, KEY_SENTINEL):
            assert sentinel.encode() not in raw


PINNED = {
    "gen_ai.operation.name",
    "gen_ai.provider.name",
    "gen_ai.request.model",
    "server.address",
    "server.port",
    "gen_ai.conversation.id",
    "tokenwire.session",
    "tokenwire.turn",
    "tokenwire.step",
}


def _check_client_span(call: Call, span: Any) -> None:
    attrs = attributes(span.attributes)
    provider, model = call.model.split("/", 1)
    assert span.name == f"chat {model}"
    assert attrs.keys() >= PINNED
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == conventions.genai_provider_name(provider)
    assert attrs["gen_ai.request.model"] == model
    assert attrs["server.address"] == "127.0.0.1"
    if call.outcome == "ok":
        assert span.status.code != STATUS_ERROR
        assert "error.type" not in attrs
        assert attrs["gen_ai.response.finish_reasons"] in (["stop"], ["tool-calls"])
    else:
        assert span.status.code == STATUS_ERROR
        assert attrs["error.type"] == call.outcome
        assert attrs["gen_ai.response.finish_reasons"] == ["error"]
    events = [e.name for e in span.events]
    assert events == (["tokenwire.stream_started"] if call.started else [])
    recording = {"deepseek": DEEPSEEK, "anthropic": ANTHROPIC}.get(provider)
    if recording is not None:
        expected = _recorded_usage(recording)
        got = {
            k: attrs.get(f"gen_ai.usage.{name}")
            for k, name in (
                ("input", "input_tokens"),
                ("output", "output_tokens"),
                ("cache_read", "cache_read.input_tokens"),
                ("cache_write", "cache_write.input_tokens"),
                ("reasoning", "reasoning.output_tokens"),
            )
            if k in expected
        }
        assert got == expected
        # streamed calls: the provider's own id and model, as the recording names them
        response_id, response_model = _recorded_head(recording)
        assert (attrs["gen_ai.response.id"], attrs["gen_ai.response.model"]) == (
            response_id,
            response_model,
        )


def _check_consumer_spans(
    spans: list[tuple[str | None, Any]], client_spans: dict[str, Any], tps: list[tuple[str, str]]
) -> None:
    """The consumer's span of every step is a child of the step's client span (one trace)."""
    consumer = [(svc, s) for svc, s in spans if svc == "tokenwire-telemetry"]
    assert len(consumer) == len(CALLS)
    for call, (trace_id, _) in zip(CALLS, tps, strict=True):
        [(_, span)] = [(v, s) for v, s in consumer if s.trace_id.hex() == trace_id]
        assert span.parent_span_id == client_spans[trace_id][1].span_id
        expected = "tokenwire.stream_started" if call.started else "tokenwire.call_failed"
        assert span.name == expected


def _check_assembler_spans(
    spans: list[tuple[str | None, Any]], client_spans: dict[str, Any], tps: list[tuple[str, str]]
) -> None:
    """The assembler's commit span of every step is a child of the step's client span."""
    commits = [s for svc, s in spans if svc == "tokenwire-assembler"]
    assert sorted(s.trace_id.hex() for s in commits) == sorted(t for t, _ in tps)
    for span in commits:
        assert span.name == "tokenwire.assembler.commit"
        assert span.parent_span_id == client_spans[span.trace_id.hex()][1].span_id


def _check_metrics(receiver: OtlpReceiver, prometheus: str, consumer: TelemetryMetrics) -> None:
    ok = sum(c.outcome == "ok" for c in CALLS)
    ttfc = receiver.received.metric_points(conventions.TIME_TO_FIRST_CHUNK)
    assert sum(p.count for _, p, _ in ttfc) == ok  # failed calls are no TTFC sample
    assert all("error.type" not in a for _, _, a in ttfc)
    durations = receiver.received.metric_points(conventions.DURATION)
    assert sum(p.count for _, p, _ in durations) == len(CALLS)
    errors = sorted(a["error.type"] for _, p, a in durations if "error.type" in a)
    assert errors == sorted(c.outcome for c in CALLS if c.outcome != "ok")
    for provider, recording in (("deepseek", DEEPSEEK), ("anthropic", ANTHROPIC)):
        expected = _recorded_usage(recording)
        for kind, name in (
            ("input", conventions.USAGE_INPUT),
            ("output", conventions.USAGE_OUTPUT),
            ("cache_read", conventions.USAGE_CACHE_READ),
            ("reasoning", conventions.USAGE_REASONING),
            ("cache_write", conventions.USAGE_CACHE_WRITE),
        ):
            points = receiver.received.metric_points(name)
            got = sum(p.as_int for _, p, a in points if a["gen_ai.provider.name"] == provider)
            assert got == expected.get(kind, 0), (provider, kind)
    assert _sample(prometheus, "tokenwire_gateway_time_to_first_chunk_seconds_count") == ok
    errors_total = _sample(prometheus, "tokenwire_gateway_call_errors_total")
    assert errors_total == len(CALLS) - ok
    deepseek = _recorded_usage(DEEPSEEK)
    assert (
        _sample(
            prometheus,
            'tokenwire_gateway_tokens_total{model="deepseek-reasoner"'
            ',provider="deepseek",type="reasoning"}',
        )
        == deepseek["reasoning"]
    )
    assert (
        _sample(
            prometheus,
            'tokenwire_gateway_tokens_total{model="deepseek-reasoner"'
            ',provider="deepseek",type="cache_read"}',
        )
        == deepseek["cache_read"]
    )
    starts = consumer.registry.get_sample_value
    assert sum(
        starts(
            "tokenwire_stream_starts_total",
            {"provider": c.model.split("/")[0], "model": c.model.split("/")[1]},
        )
        or 0
        for c in {c.model: c for c in CALLS}.values()
    ) == sum(c.started for c in CALLS)
    failed = starts(
        "tokenwire_telemetry_failed_calls_total",
        {"provider": "scripted", "model": "other", "error_type": "rate_limit_exceeded"},
    )
    assert failed == 1


def _sample(text: str, prefix: str) -> float:
    """The sum of every sample whose line starts with ``prefix``."""
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(prefix) and not line.startswith("#")
    )
