"""Parse + normalise + fold recorded Chat Completions streams, against two baselines.

Workload: the recorded Chat Completions bodies (DeepSeek reasoner, OpenAI, OpenRouter, vLLM,
Azure), fed in 1460-byte pieces (one TCP segment each), repeated until the timings are
stable. "chunks" are the provider's SSE data events, the same count for every contender.

- tokenwire: ``SseParser`` -> ``OpenAIChatNormaliser`` -> ``tokenwire.fold.fold``.
- openai SDK: its own ``SSEDecoder`` -> ``json.loads`` -> ``ChatCompletionChunk`` (built as the
  SDK builds it, ``construct_type``) -> ``ChatCompletionStreamState.handle_chunk``.
- naive: split lines, ``json.loads``, fold into dicts (no validation, no contract).

The last row runs the same pipeline on httpx-sse instead of SseParser; the second table
compares SSE parsing alone: ``SseParser`` against httpx-sse (the library
PRINCIPLES.md would have us use), fed the same pieces. It is the measurement that justifies
the hand-written parser.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx_sse
from openai._models import construct_type
from openai._streaming import SSEDecoder
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk
from tests.fixtures.recordings import RECORDINGS

from tokenwire.fold import fold
from tokenwire.providers import OpenAIChatNormaliser
from tokenwire.schemas import StreamChunk
from tokenwire.sse import SseEvent, SseParser

FILES = (
    "deepseek/reasoner-reasoning-content-usage.sse",
    "deepseek/chat-text-usage.sse",
    "openai/chat-text-include-usage.sse",
    "openai/chat-parallel-tool-calls-fragmented-usage.sse",
    "openai/chat-finish-length-usage.sse",
    "openai/chat-refusal-structured-output.sse",
    "openrouter/chat-cached-tokens-usage.sse",
    "vllm/chat-finish-length-stop-reason-null.sse",
    "azure-openai/chat-text-content-filter.sse",
)
SEGMENT = 1460


def _pieces(body: bytes) -> list[bytes]:
    return [body[i : i + SEGMENT] for i in range(0, len(body), SEGMENT)]


def tokenwire_run(bodies: list[list[bytes]]) -> int:
    """Parse, normalise and fold every body; return how many provider chunks were read."""
    events = 0
    for pieces in bodies:
        parser = SseParser()
        norm = OpenAIChatNormaliser()
        chunks: list[StreamChunk] = []
        for piece in pieces:
            for event in parser.feed(piece):
                events += 1
                chunks += norm.feed(event)
        chunks += norm.close()
        fold(chunks)
    return events


def tokenwire_on_httpx_sse_run(bodies: list[list[bytes]]) -> int:
    """The tokenwire pipeline with httpx-sse in place of SseParser (the library alternative)."""
    events = 0
    for pieces in bodies:
        response = httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=iter(pieces)
        )
        norm = OpenAIChatNormaliser()
        chunks: list[StreamChunk] = []
        for sse in httpx_sse.EventSource(response).iter_sse():
            events += 1
            chunks += norm.feed(SseEvent(sse.data, sse.event or "message", sse.id or None))
        chunks += norm.close()
        fold(chunks)
    return events


def sdk_run(bodies: list[list[bytes]]) -> int:
    events = 0
    for pieces in bodies:
        state = ChatCompletionStreamState()
        for sse in SSEDecoder().iter_bytes(iter(pieces)):
            events += 1
            if sse.data.startswith("[DONE]"):
                continue
            data = json.loads(sse.data)
            chunk = construct_type(type_=ChatCompletionChunk, value=data)
            assert isinstance(chunk, ChatCompletionChunk)  # construct_type is typed `object`
            state.handle_chunk(chunk)
        _ = state.current_completion_snapshot
    return events


def naive_run(bodies: list[list[bytes]]) -> int:
    events = 0
    for pieces in bodies:
        text = b"".join(pieces).decode()
        content: list[str] = []
        reasoning: list[str] = []
        tools: dict[int, dict[str, Any]] = {}
        usage = finish = None
        for line in text.splitlines():
            if not line.startswith("data: "):
                continue
            events += 1
            if line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            usage = data.get("usage") or usage
            for choice in data.get("choices", ()):
                finish = choice.get("finish_reason") or finish
                delta = choice.get("delta") or {}
                content.append(delta.get("content") or choice.get("text") or "")
                reasoning.append(delta.get("reasoning_content") or delta.get("reasoning") or "")
                for call in delta.get("tool_calls") or ():
                    slot = tools.setdefault(call["index"], {"args": []})
                    fn = call.get("function") or {}
                    slot["args"].append(fn.get("arguments") or "")
        _ = ("".join(content), "".join(reasoning), usage, finish, tools)
    return events


def sse_tokenwire(bodies: list[list[bytes]]) -> int:
    events = 0
    for pieces in bodies:
        parser = SseParser()
        for piece in pieces:
            events += len(parser.feed(piece))
    return events


def sse_httpx(bodies: list[list[bytes]]) -> int:
    events = 0
    for pieces in bodies:
        response = httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=iter(pieces)
        )
        events += sum(1 for _ in httpx_sse.EventSource(response).iter_sse())
    return events


def _rate(run: Callable[[list[list[bytes]]], int], bodies: list[list[bytes]], repeat: int) -> float:
    """Best of ``repeat`` timed runs, in provider chunks per second."""
    best = float("inf")
    events = 0
    for _ in range(repeat):
        started = time.perf_counter()
        events = run(bodies)
        best = min(best, time.perf_counter() - started)
    return events / best


def _workload(copies: int) -> list[list[bytes]]:
    bodies = [_pieces((Path(RECORDINGS) / name).read_bytes()) for name in FILES]
    return [pieces for _ in range(copies) for pieces in bodies]


def _check_equal_counts(bodies: list[list[bytes]]) -> None:
    runs = (tokenwire_run, tokenwire_on_httpx_sse_run, sdk_run, naive_run, sse_httpx)
    counts = {f.__name__: f(bodies) for f in runs}
    if len(set(counts.values())) != 1:
        raise AssertionError(f"contenders read different event counts: {counts}")


def _table(rows: Iterator[tuple[str, float, float]], baseline: str) -> str:
    lines = [
        f"| contender | chunks/s | tokenwire / {baseline} |",
        "| --- | ---: | ---: |",
    ]
    lines += [f"| {name} | {rate:,.0f} | {ratio:.2f}x |" for name, rate, ratio in rows]
    return "\n".join(lines)


def main() -> str:
    bodies = _workload(copies=20)
    _check_equal_counts(bodies[: len(FILES)])
    ours = _rate(tokenwire_run, bodies, 7)
    sdk = _rate(sdk_run, bodies[: len(FILES) * 2], 3)  # the SDK is slow: fewer copies
    naive = _rate(naive_run, bodies, 7)
    on_lib = _rate(tokenwire_on_httpx_sse_run, bodies, 5)
    pipeline = _table(
        iter(
            [
                ("tokenwire: SseParser + OpenAIChatNormaliser + fold", ours, 1.0),
                ("openai SDK: SSEDecoder + ChatCompletionStreamState", sdk, ours / sdk),
                ("naive: splitlines + json.loads + dict fold", naive, ours / naive),
                ("tokenwire with httpx-sse instead of SseParser", on_lib, ours / on_lib),
            ]
        ),
        "baseline",
    )
    sse_ours = _rate(sse_tokenwire, bodies, 5)
    sse_lib = _rate(sse_httpx, bodies, 5)
    sse = _table(
        iter(
            [
                ("SseParser (bytes.find, one decode per event)", sse_ours, 1.0),
                ("httpx-sse EventSource.iter_sse", sse_lib, sse_ours / sse_lib),
            ]
        ),
        "baseline",
    )
    events = tokenwire_run(bodies)
    note = (
        f"{events:,} provider chunks ({len(FILES)} recordings x 20) fed in {SEGMENT}-byte pieces;"
        " best of 5-7 runs (SDK: best of 3 on 2 copies). Targets: >= 30x the SDK, >= 1x naive."
    )
    return f"{note}\n\n{pipeline}\n\nSSE parsing alone:\n\n{sse}"


if __name__ == "__main__":
    print(main())
