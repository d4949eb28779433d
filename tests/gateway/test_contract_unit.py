"""A streaming step the fold calls broken mid-stream (issue 12, part 4): the gateway ends it
for the caller with the fold's error and publishes a finish error right after the chunk that
broke it, so the store's fold records the same error. The oracle is ``tokenwire.fold.fold``
over what was published, the assembler's own function.

The upstream here yields chunks directly (an adapter cannot produce this break from a
provider's bytes; the real-broker test of a break found at the finish is in
tests/limits/test_step_bounds.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import httpx

from tests.gateway._helpers import GATEWAY_KEY, provider_env
from tokenwire.broker import MemoryPublisher, MemoryStepRegistry
from tokenwire.fold import fold
from tokenwire.providers import Normaliser
from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    Finish,
    RecordedError,
    StreamChunk,
    TextDelta,
    ToolCallBlock,
)
from tokenwire.services.gateway import GatewayDeps, GatewaySettings, Route, create_app

AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
# An Anthropic caller of an OpenAI provider: the caller's events are encoded from the chunks.
BODY = {
    "model": "openai/gpt-4o",
    "max_tokens": 16,
    "stream": True,
    "messages": [{"role": "user", "content": "x"}],
}


class ChunkUpstream:
    """Yields the given batches of chunks as the provider's reads."""

    def __init__(self, batches: list[list[StreamChunk]]) -> None:
        self.batches_ = batches

    def send(self, route: Route, body: bytes) -> ChunkUpstream:
        return self

    def batches(
        self, normaliser: Normaliser, every_s: float = 0.0
    ) -> AsyncGenerator[list[StreamChunk], None]:
        async def reads() -> AsyncGenerator[list[StreamChunk], None]:
            for batch in self.batches_:
                yield batch

        return reads()

    def cancel(self) -> None:
        pass


async def _post(batches: list[list[StreamChunk]]) -> tuple[httpx.Response, MemoryPublisher]:
    sink = MemoryPublisher()
    deps = GatewayDeps(upstream=ChunkUpstream(batches), sink=sink, steps=MemoryStepRegistry())
    settings = GatewaySettings(keys=frozenset({GATEWAY_KEY}), provider_env=provider_env())
    transport = httpx.ASGITransport(app=create_app(settings, deps))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        response = await client.post("/v1/messages", json=BODY, headers=AUTH)
    return response, sink


def _event(frame: str) -> tuple[str, dict[str, Any]]:
    head, _, data = frame.partition("\n")
    return head.removeprefix("event: "), json.loads(data.removeprefix("data: "))


async def test_a_block_end_of_another_kind_ends_the_step_as_the_fold_records_it() -> None:
    broken = BlockEnd(index=0, block=ToolCallBlock(id="c", name="f", arguments="{}"))
    response, sink = await _post(
        [
            [BlockStart(index=0, block_type="text"), TextDelta(index=0, text="hi")],
            [broken, TextDelta(index=0, text=" more")],
            [Finish(reason="stop")],
        ]
    )
    published = [m.envelope.chunk for m in sink.messages]
    recorded = fold(published)
    assert isinstance(recorded, RecordedError)
    assert recorded.kind == "contract"
    # Published: the chunks up to the one that broke the step, then the gateway's finish.
    assert published[:3] == [
        BlockStart(index=0, block_type="text"),
        TextDelta(index=0, text="hi"),
        broken,
    ]
    assert len(published) == 4
    last = published[-1]
    assert isinstance(last, Finish)
    assert last.error is not None
    assert last.error.code == "tokenwire_contract"
    # The caller: the text before the break, then the fold's error; never message_stop.
    assert response.status_code == 200
    frames = [_event(f) for f in response.text.strip().split("\n\n")]
    assert [name for name, _ in frames][-1] == "error"
    assert "message_stop" not in [name for name, _ in frames]
    assert frames[-1][1]["error"]["message"] == recorded.message
    deltas = [d["delta"].get("text") for name, d in frames if name == "content_block_delta"]
    assert deltas == ["hi"]


async def test_a_well_formed_stream_ends_normally() -> None:
    response, sink = await _post(
        [
            [BlockStart(index=0, block_type="text"), TextDelta(index=0, text="hi")],
            [Finish(reason="stop")],
        ]
    )
    assert [name for name, _ in map(_event, response.text.strip().split("\n\n"))][-1] == (
        "message_stop"
    )
    assert not isinstance(fold([m.envelope.chunk for m in sink.messages]), RecordedError)
