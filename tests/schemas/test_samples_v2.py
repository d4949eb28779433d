"""Schema version 2 (chunk frames): recorded payloads decode, every run, to exactly these
envelopes through ``chunk_envelopes``, the one function every reader of the chunk stream
uses; version 1 payloads (samples/v1, unchanged) still decode through it.

The JSON files under samples/v2/ are hand-written documents in the version-2 encoding (one
with the keys in another order than ours, as another language's writer may send them); they
never change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from tests.schemas.test_samples_v1 import ENVELOPES as V1_ENVELOPES
from tests.schemas.test_samples_v1 import SAMPLES as V1_SAMPLES
from tests.schemas.test_samples_v1 import _assert_same
from tokenwire.schemas import (
    FRAME_TAIL,
    BlockEnd,
    BlockStart,
    ChunkEnvelope,
    ChunkFrame,
    DeploymentPrice,
    FailedAttempt,
    Finish,
    FramedChunk,
    ReasoningDelta,
    Routed,
    StepError,
    StepLink,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallDelta,
    Usage,
    chunk_envelopes,
    envelope_decoder,
    frame_head,
    frame_item,
    json_encoder,
)

SAMPLES = Path(__file__).parent / "samples" / "v2"
T0 = 1767225600000000000


def _env(
    key: tuple[str, int, int],
    ordinal: int,
    time_ns: int,
    route: tuple[str, str],
    chunk: StreamChunk,
    **first: Any,
) -> ChunkEnvelope:
    """An envelope of step ``key`` (session, turn, step) from ``route`` (provider, model)."""
    (session, turn, step), (provider, model) = key, route
    return ChunkEnvelope(
        session=session,
        turn=turn,
        step=step,
        ordinal=ordinal,
        time_ns=time_ns,
        provider=provider,
        model=model,
        chunk=chunk,
        v=1,
        **first,
    )


def _claude(ordinal: int, time_ns: int, chunk: StreamChunk, **first: Any) -> ChunkEnvelope:
    return _env(
        ("sess-1", 2, 0), ordinal, time_ns, ("anthropic", "claude-sonnet-4-5"), chunk, **first
    )


def _gpt(ordinal: int, time_ns: int, chunk: StreamChunk) -> ChunkEnvelope:
    return _env(("sess-1", 2, 1), ordinal, time_ns, ("openai", "gpt-4o"), chunk)


DEEPSEEK = ("deepseek", "deepseek-reasoner")
T1 = T0 + 20_000_000
T2 = T0 + 1_000_000_000
T3 = T0 + 2_000_000_000
T4 = T0 + 3_000_000_000
ROUTED = Routed(
    route="gpt-4o",
    deployment="azure-east",
    attempts=[
        FailedAttempt(
            deployment="openai-main",
            provider="openai",
            model="gpt-4o",
            failure="rate-limited",
            message="Rate limit reached",
            status=429,
            retry_after_s=30.0,
        ),
        FailedAttempt(
            deployment="openai-backup", provider="openai", model="gpt-4o", failure="connect"
        ),
    ],
    price=DeploymentPrice(input_pusd=2_500_000, output_pusd=10_000_000, cache_read_pusd=1_250_000),
)
FRAMES: dict[str, list[ChunkEnvelope]] = {
    "frame-first.json": [
        _claude(
            0,
            T0,
            BlockStart(index=0, block_type="text"),
            request_time_ns=T0 - 10_000_000,
            key_name="fleet-a",
            tenant="acme",
        ),
    ],
    "frame-first-with-parent.json": [  # a step's parent (issue 49): added, with a default
        _claude(
            0,
            T0,
            BlockStart(index=0, block_type="text"),
            request_time_ns=T0 - 10_000_000,
            parent=StepLink("lead-7", 0, 3),
        ),
    ],
    "frame-first-routed.json": [
        _env(
            ("sess-3", 0, 4),
            0,
            T4,
            ("azure", "gpt-4o-2024-08-06"),
            BlockStart(index=0, block_type="text"),
            request_time_ns=T4 - 500_000_000,
            routed=ROUTED,
        ),
    ],
    "frame-text.json": [
        _claude(1, T1, TextDelta(index=0, text="Hello, ")),
        _claude(2, T1 + 20_000_001, TextDelta(index=0, text="wörld ✓")),
        _claude(3, T1 + 40_000_002, BlockEnd(index=0, block=TextBlock(text="Hello, wörld ✓"))),
    ],
    "frame-tools-finish.json": [
        _gpt(
            7,
            T2,
            ToolCallDelta(index=1, id="call_1", name="get_weather", arguments_delta='{"city":'),
        ),
        _gpt(
            8, T2 + 1500, ToolCallDelta(index=2, id="call_2", name="get_time", arguments_delta="{}")
        ),
        _gpt(9, T2 + 3000, ToolCallDelta(index=1, id="call_1", arguments_delta='"Paris"}')),
        _gpt(
            10,
            T2 + 4000,
            Usage(usage=TokenUsage(input_tokens=12, output_tokens=30, cache_read_tokens=4)),
        ),
        _gpt(11, T2 + 4100, Finish(reason="tool-calls")),
    ],
    "frame-reasoning-error.json": [
        _env(("sess-2", 0, 0), 3, T3, DEEPSEEK, ReasoningDelta(index=0, text="hm")),
        _env(
            ("sess-2", 0, 0),
            4,
            T3 - 250,
            DEEPSEEK,
            Finish(
                reason="error",
                error=StepError(message="upstream closed", retryable=True, code="provider_error"),
            ),
        ),
    ],
}


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_frame_samples_decode_to_their_envelopes(name: str) -> None:
    _assert_same(chunk_envelopes((SAMPLES / name).read_bytes()), FRAMES[name])


@pytest.mark.parametrize("name", sorted(V1_ENVELOPES))
def test_version_1_samples_decode_through_the_same_function(name: str) -> None:
    payload = (V1_SAMPLES / name).read_bytes()
    _assert_same(chunk_envelopes(payload), [V1_ENVELOPES[name]])
    assert chunk_envelopes(payload) == [envelope_decoder.decode(payload)]


def test_every_sample_has_an_expectation() -> None:
    assert {p.name for p in SAMPLES.iterdir()} == set(FRAMES)


def _frame(envelopes: list[ChunkEnvelope]) -> ChunkFrame:
    first = envelopes[0]
    return ChunkFrame(
        session=first.session,
        turn=first.turn,
        step=first.step,
        ordinal=first.ordinal,
        time_ns=first.time_ns,
        provider=first.provider,
        model=first.model,
        request_time_ns=first.request_time_ns,
        key_name=first.key_name,
        tenant=first.tenant,
        parent=first.parent,
        routed=first.routed,
        chunks=[FramedChunk(e.time_ns - first.time_ns, e.chunk) for e in envelopes],
    )


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_a_frame_built_a_chunk_at_a_time_is_the_frame_encoded_whole(name: str) -> None:
    envelopes = FRAMES[name]
    first = envelopes[0]
    head = frame_head(
        session=first.session,
        turn=first.turn,
        step=first.step,
        ordinal=first.ordinal,
        time_ns=first.time_ns,
        provider=first.provider,
        model=first.model,
        request_time_ns=first.request_time_ns,
        key_name=first.key_name,
        tenant=first.tenant,
        parent=first.parent,
        routed=first.routed,
    )
    items = [frame_item(e.time_ns - first.time_ns, e.chunk) for e in envelopes]
    built = head + b",".join(items) + FRAME_TAIL
    assert built == json_encoder.encode(_frame(envelopes))
    assert chunk_envelopes(built) == envelopes


def test_a_model_name_that_looks_like_the_chunks_key_does_not_confuse_the_head() -> None:
    head = frame_head(
        session="s",
        turn=0,
        step=0,
        ordinal=1,
        time_ns=5,
        provider='p"chunks":[',
        model='"chunks":[x',
    )
    built = head + frame_item(0, TextDelta(0, "a")) + FRAME_TAIL
    [envelope] = chunk_envelopes(built)
    expected = ('p"chunks":[', '"chunks":[x', 1)
    assert (envelope.provider, envelope.model, envelope.ordinal) == expected


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (
            b'{"v":2,"session":"s","turn":0,"step":0,"ordinal":1,"time_ns":1,"provider":"p",'
            b'"model":"m","chunks":[]}',
            "at least one chunk",
        ),
        (b'{"v":3,"session":"s","chunks":[]}', "schema version 3"),
        (
            b'{"v":2,"session":"s","turn":0,"step":0,"ordinal":1,"time_ns":1,"provider":"p",'
            b'"model":"m","chunks":[[0]]}',
            "chunks",
        ),
        (
            b'{"v":2,"session":"s","turn":0,"step":0,"ordinal":1,"time_ns":1,"provider":"p",'
            b'"model":"m","chunks":[[0,{"type":"nope"}]]}',
            "nope",
        ),
        (b'{"turn":0,"v":2}', "session"),
        (b"not json", "JSON"),
    ],
)
def test_a_payload_that_is_neither_version_is_a_decode_error(payload: bytes, message: str) -> None:
    with pytest.raises(msgspec.DecodeError, match=message):
        chunk_envelopes(payload)
