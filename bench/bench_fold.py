"""The one fold's throughput, linearity and memory, beside a naive ``+=`` fold in the same run.

Cases: text streams (one text block) and tool-call streams (two interleaved tool calls at
indexes 1 and 2) of 1k, 100k and 1M chunks, folded from pre-decoded chunks and from encoded
``ChunkEnvelope`` JSON lines (decoded with ``envelope_decoder``). The baseline is the fold people
write first: a dict of per-index strings grown with ``+=`` (over the same pre-decoded chunks,
or over ``json.loads`` of the same lines). CPython cannot grow a str held by a dict in place, so
that baseline is quadratic; it is stopped after ``BASELINE_BUDGET_S`` and its rate is reported
over the chunks it got through (marked *).
"""

from __future__ import annotations

import gc
import json
import time
import tracemalloc
from collections.abc import Callable, Sequence
from typing import Any

from tokenwire.fold import StepFold, fold
from tokenwire.schemas import (
    ChunkEnvelope,
    Finish,
    Message,
    StreamChunk,
    TextDelta,
    ToolCallDelta,
    envelope_decoder,
    json_encoder,
)

SIZES = (1_000, 100_000, 1_000_000)
BASELINE_BUDGET_S = 4.0
SLICE = 4096  # the baseline checks its time budget between slices, not per chunk
WORDS = ("the", " quick", " brown", " fox", " jumps", " over", " a", " lazy", " dog", ".\n")


def text_chunks(n: int) -> list[StreamChunk]:
    """A text stream of ``n`` chunks: ``n - 1`` word-sized deltas and a finish."""
    deltas: list[StreamChunk] = [TextDelta(index=0, text=WORDS[i % 10]) for i in range(n - 1)]
    return [*deltas, Finish(reason="stop")]


def tool_chunks(n: int) -> list[StreamChunk]:
    """Two tool calls whose argument fragments alternate (indexes 1 and 2), then a finish."""
    out: list[StreamChunk] = []
    for i in range(n - 1):
        index = 1 + i % 2
        out.append(
            ToolCallDelta(
                index=index,
                id=f"call_{index}",
                name="search" if i < 2 else None,
                arguments_delta='{"q": "' if i < 2 else f"w{i % 97} ",
            )
        )
    return [*out, Finish(reason="tool-calls")]


def envelope_lines(chunks: Sequence[StreamChunk]) -> list[bytes]:
    return [
        json_encoder.encode(
            ChunkEnvelope(
                session="bench",
                turn=0,
                step=0,
                ordinal=i,
                time_ns=1_767_225_600_000_000_000 + i,
                provider="openai",
                model="gpt-4o",
                chunk=chunk,
            )
        )
        for i, chunk in enumerate(chunks)
    ]


# -- ours ------------------------------------------------------------------------------------


def ours_chunks(chunks: Sequence[StreamChunk]) -> object:
    return fold(chunks)


def ours_lines(lines: Sequence[bytes]) -> object:
    step = StepFold()
    feed, decode = step.feed, envelope_decoder.decode
    for line in lines:
        feed(decode(line).chunk)
    return step.result()


# -- the naive baseline ------------------------------------------------------------------------


def naive_chunks(chunks: Sequence[StreamChunk], deadline: float) -> int:
    """Per-index ``+=`` over pre-decoded chunks; returns how many chunks it folded in time."""
    texts: dict[int, str] = {}
    args: dict[int, str] = {}
    for start in range(0, len(chunks), SLICE):
        for c in chunks[start : start + SLICE]:
            if isinstance(c, TextDelta):
                if c.index in texts:
                    texts[c.index] += c.text
                else:
                    texts[c.index] = c.text
            elif isinstance(c, ToolCallDelta):
                if c.index in args:
                    args[c.index] += c.arguments_delta
                else:
                    args[c.index] = c.arguments_delta
        if time.perf_counter() > deadline:
            return min(start + SLICE, len(chunks))
    return len(chunks)


def naive_lines(lines: Sequence[bytes], deadline: float) -> int:
    """``json.loads`` + per-index ``+=`` on dicts; returns how many lines it folded in time."""
    texts: dict[int, str] = {}
    args: dict[int, str] = {}
    for start in range(0, len(lines), SLICE):
        for line in lines[start : start + SLICE]:
            c = json.loads(line)["chunk"]
            kind = c["type"]
            if kind == "text-delta":
                texts[c["index"]] = texts.get(c["index"], "") + c["text"]
            elif kind == "tool-call-delta":
                args[c["index"]] = args.get(c["index"], "") + c.get("arguments_delta", "")
        if time.perf_counter() > deadline:
            return min(start + SLICE, len(lines))
    return len(lines)


# -- measuring --------------------------------------------------------------------------------


def best_seconds(run: Callable[[], object], n: int) -> float:
    """Best of a few runs (more for small inputs), GC paused as for every measured loop."""
    repeats = max(3, min(200, 200_000 // n))
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def baseline_rate(run: Callable[[float], int]) -> tuple[float, int]:
    started = time.perf_counter()
    done = run(started + BASELINE_BUDGET_S)
    return done / (time.perf_counter() - started), done


def row(case: str, n: int, ours_s: float, base: tuple[float, int]) -> tuple[list[str], float]:
    ours_rate = n / ours_s
    base_rate, base_done = base
    mark = "" if base_done == n else f" * ({base_done:,} in {BASELINE_BUDGET_S:.0f} s)"
    ns = ours_s / n * 1e9
    cells = [
        case,
        f"{n:,}",
        f"{ours_rate:,.0f}",
        f"{base_rate:,.0f}{mark}",
        f"{ours_rate / base_rate:.1f}x",
        f"{ns:.0f}",
    ]
    return cells, ns


def measure(kind: str, make: Callable[[int], list[StreamChunk]]) -> tuple[list[list[str]], dict]:
    rows: list[list[str]] = []
    ns_per_chunk: dict[tuple[str, int], float] = {}
    for n in SIZES:
        chunks = make(n)
        cells, ns_per_chunk[(kind, n)] = row(
            f"{kind}, pre-decoded",
            n,
            best_seconds(lambda c=chunks: ours_chunks(c), n),
            baseline_rate(lambda d, c=chunks: naive_chunks(c, d)),
        )
        rows.append(cells)
        lines = envelope_lines(chunks)
        del chunks
        cells, _ = row(
            f"{kind}, envelope JSON lines",
            n,
            best_seconds(lambda ls=lines: ours_lines(ls), n),
            baseline_rate(lambda d, ls=lines: naive_lines(ls, d)),
        )
        rows.append(cells)
        del lines
    return rows, ns_per_chunk


def memory_rows(n: int) -> list[list[str]]:
    """tracemalloc peak of one n-chunk text step against the UTF-8 size of its text."""
    chunks = text_chunks(n)
    text_bytes = sum(len(c.text.encode()) for c in chunks if isinstance(c, TextDelta))
    lines = envelope_lines(chunks)
    first = _memory_row("fold of pre-decoded chunks", lambda: fold(chunks), text_bytes)
    chunks.clear()  # the second row decodes each chunk itself and drops it after the feed
    second = _memory_row(
        "decode + fold, each chunk released after its feed", lambda: ours_lines(lines), text_bytes
    )
    return [first, second]


def _memory_row(what: str, run: Callable[[], Any], text_bytes: int) -> list[str]:
    gc.collect()
    tracemalloc.start()
    result = run()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert isinstance(result, Message)
    assert len(result.text.encode()) == text_bytes
    return [
        what,
        f"{peak / 2**20:.1f} MiB",
        f"{text_bytes / 2**20:.1f} MiB",
        f"{peak / text_bytes:.2f}x",
    ]


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main() -> str:
    gc_was_enabled = gc.isenabled()
    gc.disable()  # the same for ours and the baseline; neither creates reference cycles
    try:
        text_rows, text_ns = measure("text", text_chunks)
        tool_rows, tool_ns = measure("tool calls", tool_chunks)
    finally:
        if gc_was_enabled:
            gc.enable()
    throughput = table(
        ["case", "chunks", "ours chunks/s", "baseline chunks/s", "ratio", "ours ns/chunk"],
        text_rows + tool_rows,
    )
    n = SIZES[-1]
    memory = table(
        [f"memory, text step of {n:,} chunks", "tracemalloc peak", "text (UTF-8)", "peak / text"],
        memory_rows(n),
    )
    linearity = table(
        ["linearity (pre-decoded)", f"ns/chunk at {SIZES[0]:,}", f"ns/chunk at {n:,}", "ratio"],
        [
            [
                kind,
                f"{ns[(kind, SIZES[0])]:.0f}",
                f"{ns[(kind, n)]:.0f}",
                f"{ns[(kind, n)] / ns[(kind, SIZES[0])]:.2f}",
            ]
            for kind, ns in (("text", text_ns), ("tool calls", tool_ns))
        ],
    )
    notes = (
        "Baseline: a dict of per-index strings grown with `+=` (pre-decoded rows), or "
        "`json.loads` + the same on dicts (envelope rows); * = quadratic, stopped after "
        f"{BASELINE_BUDGET_S:.0f} s, rate over the chunks it folded. Targets: >= 1,000,000 "
        "chunks/s pre-decoded text, linearity <= 1.5, memory <= 3x text."
    )
    return "\n\n".join([throughput, linearity, memory, notes])


if __name__ == "__main__":
    print(main())
