"""The gateway's own figures per model call, on in-memory seams: a failed call is an error with
its error.type and never a TTFC sample; tokens by type equal the recording's usage; unknown or
malformed model names mint no series."""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import CollectorRegistry

from tests.gateway._helpers import GATEWAY_KEY, make_rig, recording
from tokenwire.observability import BoundedLabels
from tokenwire.providers import ProviderHTTPError

AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
USAGE_RECORDING = "openai/chat-text-include-usage.sse"


def _body(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _registry(rig: Any) -> CollectorRegistry:
    registry: CollectorRegistry = rig.app.state.gateway.metrics.registry
    return registry


def _samples(rig: Any, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in _registry(rig).collect()
        for s in family.samples
        if s.name == name
    }


def _recorded_usage() -> dict[str, Any]:
    lines = recording(USAGE_RECORDING).decode().splitlines()
    events = [json.loads(x[5:]) for x in lines if x.startswith("data: {")]
    return next(e["usage"] for e in events if e.get("usage"))


async def test_successful_calls_count_ttfc_duration_and_tokens_by_type() -> None:
    rig = make_rig(recording(USAGE_RECORDING))
    async with rig.client(**AUTH) as client:
        for _ in range(2):
            response = await client.post("/v1/chat/completions", json=_body("openai/gpt-4o"))
            assert response.status_code == 200
    labels = (("model", "gpt-4o"), ("provider", "openai"))
    ttfc = _samples(rig, "tokenwire_gateway_time_to_first_chunk_seconds_count")
    assert ttfc == {labels: 2}
    calls = _samples(rig, "tokenwire_gateway_calls_total")
    assert calls == {(*labels[:1], ("outcome", "ok"), *labels[1:]): 2}
    gaps = _samples(rig, "tokenwire_gateway_time_per_output_chunk_seconds_count")
    assert gaps == {labels: 2}
    usage = _recorded_usage()
    tokens = {
        dict(k)["type"]: v for k, v in _samples(rig, "tokenwire_gateway_tokens_total").items()
    }
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    reasoning = usage["completion_tokens_details"]["reasoning_tokens"]
    expected = {"input": 2 * (usage["prompt_tokens"] - cached)}
    expected["output"] = 2 * (usage["completion_tokens"] - reasoning)
    assert {k: v for k, v in tokens.items() if k in expected} == expected
    assert _samples(rig, "tokenwire_gateway_call_errors_total") == {}


async def test_an_error_as_the_first_chunk_is_a_failed_call_not_a_start() -> None:
    body = b'data: {"error":{"message":"busy","type":"server_error","code":"server_error"}}\n\n'
    rig = make_rig(body)
    async with rig.client(**AUTH) as client:
        response = await client.post("/v1/chat/completions", json=_body("openai/gpt-4o"))
    assert response.status_code == 502
    [published] = rig.sink.messages
    assert published.envelope.ordinal == 0  # recorded as the step's one chunk
    assert _samples(rig, "tokenwire_gateway_time_to_first_chunk_seconds_count") == {}
    errors = _samples(rig, "tokenwire_gateway_call_errors_total")
    assert errors == {
        (("error_type", "server_error"), ("model", "other"), ("provider", "openai")): 1
    }


async def test_unknown_and_malformed_model_names_mint_no_series() -> None:
    rig = make_rig(ProviderHTTPError(404, "The model does not exist", retryable=False))
    names = [f"openai/made-up-{i}" for i in range(40)] + [
        "openai/../x y\n{}",
        "openai/" + "m" * 300,
    ]
    async with rig.client(**AUTH) as client:
        for name in names:
            response = await client.post("/v1/chat/completions", json=_body(name))
            assert response.status_code == 404
    models = {
        dict(labels)["model"]
        for name in ("tokenwire_gateway_calls_total", "tokenwire_gateway_call_errors_total")
        for labels in _samples(rig, name)
    }
    assert models == {"other"}
    errors = _samples(rig, "tokenwire_gateway_call_errors_total")
    assert errors == {(("error_type", "404"), ("model", "other"), ("provider", "openai")): 42}


def test_bounded_labels_admit_well_formed_values_up_to_the_limit() -> None:
    labels = BoundedLabels(limit=2, fallback="other")
    assert labels.known("a") == "other"
    assert [labels.admit(v) for v in ("a", "bad value", "b", "c", "a")] == [
        "a",
        "other",
        "b",
        "other",
        "a",
    ]
    assert labels.known("b") == "b"
