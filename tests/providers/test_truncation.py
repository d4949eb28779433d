"""Truncation keeps what completed: every real recording cut at every event boundary.

Each recording's events are cut after event ``k`` (every ``k`` before the provider's own
terminal event), and the dialect's truncating finish is appended as the provider sends it
(Chat ``finish_reason: "length"`` + ``[DONE]``, Anthropic ``stop_reason: "max_tokens"`` +
``message_stop``, Responses ``response.incomplete`` with ``max_output_tokens``, Gemini
``finishReason: MAX_TOKENS``). Whatever blocks were open then, the adapter must end the step
with ``finish max-tokens`` (never a protocol error) and the fold must give a message that

- keeps every text and reasoning block that had content, each a prefix of the same block in
  the whole recording (the independent oracle: the uncut stream);
- holds no tool call: every call, ended or cut, is in ``dropped_tool_calls``;
- lists in ``truncated_blocks`` exactly the blocks the cut left open.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixtures.recordings import RECORDINGS, recordings_dir
from tests.providers.conftest import recording_names, split_sse
from tokenwire.fold import fold
from tokenwire.providers import get_provider, normalise_body
from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    Finish,
    Message,
    ReasoningBlock,
    StreamChunk,
    TextBlock,
    ToolCallBlock,
)
from tokenwire.sse import SseEvent, SseParser

_PROVIDER = {
    "openai": "openai",
    "azure-openai": "azure",
    "deepseek": "deepseek",
    "groq": "groq",
    "openrouter": "openrouter",
    "vllm": "vllm",
    "openai-responses": "openai-responses",
    "anthropic": "anthropic",
    "google": "gemini",
}
_LENGTH = '{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}'
_TAILS: dict[str, list[SseEvent]] = {
    "openai-chat": [SseEvent(data=_LENGTH), SseEvent(data="[DONE]")],
    "anthropic-messages": [
        SseEvent(
            event="message_delta",
            data='{"type":"message_delta","delta":{"stop_reason":"max_tokens"}}',
        ),
        SseEvent(event="message_stop", data='{"type":"message_stop"}'),
    ],
    "openai-responses": [
        SseEvent(
            event="response.incomplete",
            data=json.dumps(
                {
                    "type": "response.incomplete",
                    "response": {
                        "id": "resp_cut",
                        "status": "incomplete",
                        "incomplete_details": {"reason": "max_output_tokens"},
                    },
                }
            ),
        )
    ],
    "gemini": [
        SseEvent(data='{"candidates":[{"content":{"parts":[]},"finishReason":"MAX_TOKENS"}]}')
    ],
}


@dataclass(frozen=True)
class Recording:
    folder: str
    name: str

    @property
    def provider(self) -> str:
        return _PROVIDER[self.folder]

    def events(self) -> list[SseEvent]:
        return split_sse((recordings_dir() / self.folder / f"{self.name}.sse").read_bytes())


def _all_recordings() -> list[Recording]:
    if not RECORDINGS.is_dir():
        return []
    return [
        Recording(folder, name)
        for folder in sorted(_PROVIDER)
        if (RECORDINGS / folder).is_dir()
        for name in recording_names(folder)
    ]


RECORDED = _all_recordings()


def _chunks(provider: str, events: list[SseEvent]) -> list[StreamChunk]:
    normaliser = get_provider(provider).normaliser()
    out = [c for event in events for c in normaliser.feed(event)]
    return out + normaliser.close()


def _cut_points(recording: Recording) -> range:
    """Every boundary before the provider's own terminal event (after it, a tail is ignored)."""
    spec = get_provider(recording.provider)
    first = 1 if spec.dialect == "anthropic-messages" else 0  # usage starts at message_start
    normaliser = spec.normaliser()
    events = recording.events()
    for k, event in enumerate(events):
        if '"finishReason"' in event.data or any(
            isinstance(c, Finish) for c in normaliser.feed(event)
        ):
            return range(first, k + 1)
    return range(first, len(events) + 1)


def _whole_blocks(recording: Recording) -> dict[int, str]:
    """The text of each text/reasoning block of the uncut recording, by block index."""
    body = (RECORDINGS / recording.folder / f"{recording.name}.sse").read_bytes()
    whole = normalise_body(recording.provider, body)
    out: dict[int, str] = {}
    for chunk in whole:
        if isinstance(chunk, BlockEnd) and isinstance(chunk.block, TextBlock | ReasoningBlock):
            out[chunk.index] = chunk.block.text
        elif hasattr(chunk, "text") and hasattr(chunk, "index"):
            out[chunk.index] = out.get(chunk.index, "") + chunk.text  # delta-only blocks
    return out


def check_cut(recording: Recording, k: int, whole: dict[int, str]) -> None:
    dialect = get_provider(recording.provider).dialect
    chunks = _chunks(recording.provider, recording.events()[:k] + _TAILS[dialect])
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert (finish.reason, finish.error) == ("max-tokens", None), (recording, k, finish)
    started = {c.index: c.block_type for c in chunks if isinstance(c, BlockStart)}
    ended = {c.index for c in chunks if isinstance(c, BlockEnd)}
    result = fold(chunks)
    assert isinstance(result, Message), (recording, k, result)
    assert result.finish_reason == "max-tokens"
    assert result.tool_calls == []
    calls = [i for i, kind in started.items() if kind == "tool-call"]
    assert len(result.dropped_tool_calls) == len(calls)
    assert result.truncated_blocks == sorted(set(started) - ended)
    kept = [b for b in result.content if not isinstance(b, ToolCallBlock)]
    assert len(kept) == len(result.content)
    texts = [(i, kind) for i, kind in sorted(started.items()) if kind in ("text", "reasoning")]
    assert len(kept) == len(texts)
    for block, (index, kind) in zip(kept, texts, strict=True):
        assert isinstance(block, TextBlock if kind == "text" else ReasoningBlock)
        assert whole[index].startswith(block.text), (recording, k, index)


@pytest.mark.parametrize("recording", RECORDED, ids=[f"{r.folder}/{r.name}" for r in RECORDED])
def test_every_event_boundary_of_a_recording_truncates_cleanly(recording: Recording) -> None:
    whole = _whole_blocks(recording)
    cuts = _cut_points(recording)
    assert len(cuts) >= 1
    for k in cuts:
        check_cut(recording, k, whole)


def test_the_recordings_are_all_covered() -> None:
    recordings_dir()
    assert len(RECORDED) >= 30
    assert {r.folder for r in RECORDED} >= {"openai", "anthropic", "openai-responses", "google"}


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_a_cut_body_split_anywhere_truncates_the_same(data: st.DataObject) -> None:
    """The truncated body as bytes, split at arbitrary points, folds to the same message."""
    recordings_dir()
    recording = data.draw(st.sampled_from(RECORDED))
    k = data.draw(st.sampled_from(_cut_points(recording)))
    dialect = get_provider(recording.provider).dialect
    events = recording.events()[:k] + _TAILS[dialect]
    body = b"".join(_frame(e) for e in events)
    want = fold(_chunks(recording.provider, events))
    cuts = sorted(data.draw(st.sets(st.integers(0, len(body)), max_size=8)))
    parser = SseParser()
    normaliser = get_provider(recording.provider).normaliser()
    chunks: list[StreamChunk] = []
    for piece in (body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)):
        for event in parser.feed(piece):
            chunks += normaliser.feed(event)
    for event in parser.close():
        chunks += normaliser.feed(event)
    assert fold(chunks + normaliser.close()) == want


def _frame(event: SseEvent) -> bytes:
    head = f"event: {event.event}\n" if event.event != "message" else ""
    return f"{head}data: {event.data}\n\n".encode()
