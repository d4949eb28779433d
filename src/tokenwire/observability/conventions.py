"""The names tokenwire's telemetry uses: the OpenTelemetry GenAI semantic conventions, pinned.

Pinned to **semantic-conventions-genai v0.1.0** (github.com/open-telemetry/semantic-conventions-
genai, the first release of the GenAI conventions after they left the main repository; its
docs/gen-ai/client-inference.md and gen-ai-token-metrics.md): the CLIENT span
``gen_ai.client.inference`` named ``{gen_ai.operation.name} {gen_ai.request.model}``, the
histograms ``gen_ai.client.inference.duration`` / ``.time_to_first_chunk`` /
``.time_per_output_chunk`` (unit ``s``) and the ``gen_ai.client.inference.usage.*`` counters
(unit ``{token}``, with ``gen_ai.token.modality``).

``OTEL_SEMCONV_STABILITY_OPT_IN`` containing ``gen_ai_v1_41/dup`` also emits the metric names
of semantic-conventions v1.41 (``gen_ai.client.operation.duration``,
``gen_ai.client.operation.time_to_first_chunk``, ``gen_ai.client.token.usage``) for dashboards
built on them (docs/telemetry.md).
"""

from __future__ import annotations

from collections.abc import Mapping

SEMCONV_RELEASE = "semantic-conventions-genai v0.1.0"
SCHEMA_URL = "https://opentelemetry.io/schemas/1.44.0"
"""The core conventions the GenAI v0.1.0 release links to (error.type, server.*)."""

SPAN_TYPE = "gen_ai.client.inference"
OPERATION = "chat"

DURATION = "gen_ai.client.inference.duration"
TIME_TO_FIRST_CHUNK = "gen_ai.client.inference.time_to_first_chunk"
TIME_PER_OUTPUT_CHUNK = "gen_ai.client.inference.time_per_output_chunk"
USAGE_INPUT = "gen_ai.client.inference.usage.input_tokens"
USAGE_OUTPUT = "gen_ai.client.inference.usage.output_tokens"
USAGE_CACHE_READ = "gen_ai.client.inference.usage.cache_read.input_tokens"
USAGE_CACHE_WRITE = "gen_ai.client.inference.usage.cache_write.input_tokens"
USAGE_REASONING = "gen_ai.client.inference.usage.reasoning.output_tokens"

LEGACY_OPT_IN = "gen_ai_v1_41/dup"
LEGACY_DURATION = "gen_ai.client.operation.duration"
LEGACY_TIME_TO_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"
LEGACY_TOKEN_USAGE = "gen_ai.client.token.usage"

ERROR_OTHER = "_OTHER"
"""``error.type`` when no low-cardinality identifier of the error is known."""

LATENCY_BUCKETS_S = (
    0.01,
    0.02,
    0.04,
    0.08,
    0.16,
    0.32,
    0.64,
    1.28,
    2.56,
    5.12,
    10.24,
    20.48,
    40.96,
    81.92,
    120.0,
)
"""Durations and time to first chunk: the conventions' advised boundaries, plus 120 s for
reasoning models' first chunks. Every tokenwire TTFC histogram uses these."""

CHUNK_GAP_BUCKETS_S = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    10.0,
    120.0,
)
"""Time per output chunk: chunks usually arrive milliseconds apart."""

TOKEN_BUCKETS = (1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
"""The legacy ``gen_ai.client.token.usage`` histogram (v1.41's advised boundaries)."""

_PROVIDER_NAMES = {
    "openai": "openai",
    "openai-responses": "openai",
    "azure": "azure.ai.openai",
    "anthropic": "anthropic",
    "deepseek": "deepseek",
    "gemini": "gcp.gemini",
    "groq": "groq",
    "mistral": "mistral_ai",
    "xai": "x_ai",
}


def genai_provider_name(provider: str) -> str:
    """The ``gen_ai.provider.name`` well-known value for a tokenwire provider name."""
    return _PROVIDER_NAMES.get(provider, provider)


def legacy_names(env: Mapping[str, str]) -> bool:
    """Whether ``OTEL_SEMCONV_STABILITY_OPT_IN`` asks for the v1.41 metric names as well."""
    values = env.get("OTEL_SEMCONV_STABILITY_OPT_IN", "")
    return LEGACY_OPT_IN in {v.strip() for v in values.split(",")}
