"""The SDK set-up from the standard OTEL_* variables, and the v1.41 names on request."""

from __future__ import annotations

from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

from tests.gateway._helpers import GATEWAY_KEY, make_rig, recording
from tokenwire.observability import conventions, otel_from_env, resource_for, sdk_providers


def test_nothing_is_installed_without_an_endpoint() -> None:
    assert not otel_from_env("svc", {}).sdk
    disabled = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"}
    assert not otel_from_env("svc", disabled).sdk


def test_an_endpoint_installs_sdk_providers_named_by_otel_service_name() -> None:
    for variable in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        otel = otel_from_env("svc", {variable: "http://127.0.0.1:1", "OTEL_SERVICE_NAME": "mine"})
        try:
            assert otel.sdk
            assert isinstance(otel.tracer_provider, TracerProvider)
            assert otel.tracer_provider.resource.attributes["service.name"] == "mine"
        finally:
            otel.shutdown()


def test_resource_attributes_are_honoured_and_the_service_name_is_only_a_default() -> None:
    assert resource_for("svc", {}).attributes["service.name"] == "svc"
    env = {"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs,deployment.environment=prod%20eu"}
    attributes = resource_for("svc", env).attributes
    assert attributes["service.name"] == "from-attrs"
    assert attributes["deployment.environment"] == "prod eu"
    both = {**env, "OTEL_SERVICE_NAME": "from-name"}
    assert resource_for("svc", both).attributes["service.name"] == "from-name"


def _metric_names(reader: InMemoryMetricReader) -> set[str]:
    data = reader.get_metrics_data()
    assert data is not None
    return {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


async def _one_call(env: dict[str, str]) -> set[str]:
    reader = InMemoryMetricReader()
    otel = sdk_providers("gw", env, [reader], [])
    rig = make_rig(recording("openai/chat-text-include-usage.sse"), otel=otel)
    body = {"model": "openai/gpt-4o", "messages": [{"role": "user", "content": "x"}]}
    async with rig.client(authorization=f"Bearer {GATEWAY_KEY}") as client:
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    names = _metric_names(reader)
    otel.shutdown()
    return names


async def test_the_pinned_names_by_default_and_the_v1_41_ones_on_opt_in() -> None:
    pinned = {conventions.DURATION, conventions.TIME_TO_FIRST_CHUNK, conventions.USAGE_INPUT}
    legacy = {
        conventions.LEGACY_DURATION,
        conventions.LEGACY_TIME_TO_FIRST_CHUNK,
        conventions.LEGACY_TOKEN_USAGE,
    }
    default = await _one_call({})
    assert pinned <= default
    assert not legacy & default
    opted = await _one_call({"OTEL_SEMCONV_STABILITY_OPT_IN": "http,gen_ai_v1_41/dup"})
    assert pinned | legacy <= opted
