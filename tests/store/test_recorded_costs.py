"""Done-when of the ledger: the costs of the recorded provider streams match genai-prices.

Each recording is folded with its adapter and committed as a step, in every store (memory,
a SQLite file, PostgreSQL), and its ledger line read back from the store; the line's cost is
compared with genai-prices called directly on the usage numbers read here from the raw
recording's JSON (not from our fold), in genai-prices' own terms: input tokens including cache
reads and writes, output tokens including reasoning. The step's model is the model the raw
response names (what a caller would have asked for).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import ROUND_HALF_EVEN
from pathlib import Path
from typing import Any

import pytest
from genai_prices import Usage, calc_price

from tokenwire.fold import fold
from tokenwire.providers import normalise_body
from tokenwire.schemas import ChunkEnvelope
from tokenwire.store import StepRecord, Store

AT_NS = 1_767_571_200 * 10**9  # 2026-01-05T00:00:00Z: the prices in force then
PROVIDERS = {  # recordings folder -> (tokenwire provider, genai-prices provider id)
    "openai": ("openai", "openai"),
    "openai-responses": ("openai-responses", "openai"),
    "anthropic": ("anthropic", "anthropic"),
    "deepseek": ("deepseek", "deepseek"),
    "google": ("gemini", "google"),
    "openrouter": ("openrouter", "openrouter"),
    "groq": ("groq", "groq"),
    "azure-openai": ("azure", "azure"),
    "vllm": ("vllm", None),  # self-hosted: no list price
}


@dataclass(frozen=True)
class Raw:
    """What the raw recording says: the model and the usage in genai-prices' terms."""

    model: str
    usage: dict[str, int] | None


def _events(body: bytes) -> list[dict[str, Any]]:
    out = []
    for line in body.decode().splitlines():
        data = line.removeprefix("data:").strip()
        if line.startswith("data:") and data.startswith("{"):
            out.append(json.loads(data))
    return out


def _chat(events: list[dict[str, Any]]) -> Raw:
    """OpenAI Chat format (OpenAI, DeepSeek, OpenRouter, Groq, Azure, vLLM): the last usage."""
    model = next((e["model"] for e in events if e.get("model")), "")
    usage = next((e["usage"] for e in reversed(events) if e.get("usage")), None)
    if usage is None:
        return Raw(model, None)
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") or usage.get("prompt_cache_hit_tokens") or 0
    return Raw(
        model,
        {
            "input_tokens": usage["prompt_tokens"],
            "cache_read_tokens": cached,
            "output_tokens": usage["completion_tokens"],
        },
    )


def _responses(events: list[dict[str, Any]]) -> Raw:
    done = [e["response"] for e in events if isinstance(e.get("response"), dict)]
    model = next((r["model"] for r in done if r.get("model")), "")
    usage = next((r["usage"] for r in reversed(done) if r.get("usage")), None)
    if usage is None:
        return Raw(model, None)
    cached = (usage.get("input_tokens_details") or {}).get("cached_tokens") or 0
    return Raw(
        model,
        {
            "input_tokens": usage["input_tokens"],
            "cache_read_tokens": cached,
            "output_tokens": usage["output_tokens"],
        },
    )


_ANTHROPIC_KEYS = (
    "input_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
    "output_tokens",
)


def _anthropic(events: list[dict[str, Any]]) -> Raw:
    """Anthropic documents message_delta's usage as cumulative: each count is the last one
    sent (message_start, then message_delta); with ``iterations`` (server-side compaction)
    every iteration is billed, so the counts are their sums."""
    start = next(e["message"] for e in events if e.get("type") == "message_start")
    counts: dict[str, int] = {}
    final: dict[str, Any] = {}
    for e in events:
        usage = start["usage"] if e.get("type") == "message_start" else e.get("usage")
        if e.get("type") in ("message_start", "message_delta") and usage:
            counts.update({k: usage[k] for k in _ANTHROPIC_KEYS if usage.get(k) is not None})
            final = usage
    if final.get("iterations"):
        counts = {k: sum(it.get(k) or 0 for it in final["iterations"]) for k in _ANTHROPIC_KEYS}
    write = counts.get("cache_creation_input_tokens", 0)
    read = counts.get("cache_read_input_tokens", 0)
    return Raw(
        start["model"],
        {
            "input_tokens": counts["input_tokens"] + write + read,
            "cache_write_tokens": write,
            "cache_read_tokens": read,
            "output_tokens": counts["output_tokens"],
        },
    )


def _gemini(events: list[dict[str, Any]]) -> Raw:
    meta = events[-1]["usageMetadata"]
    output = meta.get("candidatesTokenCount", 0) + meta.get("thoughtsTokenCount", 0)
    return Raw(
        events[-1]["modelVersion"],
        {
            "input_tokens": meta["promptTokenCount"],
            "cache_read_tokens": meta.get("cachedContentTokenCount", 0),
            "output_tokens": output,
        },
    )


def raw_of(folder: str, body: bytes) -> Raw:
    events = _events(body)
    if folder == "anthropic":
        return _anthropic(events)
    if folder == "google":
        return _gemini(events)
    if folder == "openai-responses":
        return _responses(events)
    return _chat(events)


def recordings_list() -> list[str]:
    from tests.fixtures.recordings import RECORDINGS

    if not RECORDINGS.is_dir():
        return ["(recordings missing)"]
    return sorted(
        str(p.relative_to(RECORDINGS))
        for p in RECORDINGS.glob("*/*.sse")
        if p.parent.name in PROVIDERS and not p.name.startswith("legacy-")
    )


def independent_cost(raw: Raw, provider_id: str) -> int | None:
    """genai-prices on the raw numbers; None when it has no price for the model."""
    assert raw.usage is not None
    try:
        price = calc_price(
            Usage(**raw.usage),
            raw.model,
            provider_id=provider_id,
            genai_request_timestamp=datetime.fromtimestamp(AT_NS // 10**9, UTC),
        )
    except LookupError:
        return None
    return int((price.total_price * 10**12).to_integral_value(ROUND_HALF_EVEN))


@pytest.mark.parametrize("name", recordings_list())
async def test_the_cost_of_a_recorded_stream_is_genai_prices_on_its_raw_usage(
    recordings: Path, name: str, store: Store
) -> None:
    folder = name.split("/", maxsplit=1)[0]
    provider, provider_id = PROVIDERS[folder]
    body = (recordings / name).read_bytes()
    raw = raw_of(folder, body)
    chunks = normalise_body(provider, body)
    envelopes = [
        ChunkEnvelope("rec", 0, 0, i, AT_NS + i, provider, raw.model, c)
        for i, c in enumerate(chunks)
    ]
    await store.commit(
        [StepRecord("rec", 0, 0, provider, raw.model, envelopes, fold(chunks), AT_NS + len(chunks))]
    )
    [line] = await store.session_usage("rec")  # as the store keeps it
    if raw.usage is None:
        assert (line.usage, line.cost_pusd, line.cost_reason) == (None, None, "no usage reported")
        return
    assert line.usage is not None  # the provider sent usage: the fold kept it
    expected = independent_cost(raw, provider_id) if provider_id is not None else None
    if expected is None:
        assert line.cost_pusd is None
        assert line.cost_reason is not None
        assert line.cost_reason.startswith(f"no price for {provider}/{raw.model}")
    else:
        assert line.cost_pusd == expected, (line.usage, raw.usage)
        assert line.cost_reason is None
    assert line.price_version.startswith("genai-prices ")
