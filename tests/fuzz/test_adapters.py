"""Fuzzing every adapter (issue 12, part 5): hypothesis mutates the real recordings and makes
random SSE bytes; the SSE parser and the adapter must never raise, never break the adapter
contract (one finish, last; usage right before it; blocks started before and never touched
after their end), and keep their output bounded by their input; the fold of what they made
must give a message or a recorded error, never an exception.

Bounded in the default suite (``TOKENWIRE_FUZZ_EXAMPLES``, 30 per adapter and strategy,
derandomized); ``make fuzz`` runs 100,000 per adapter and strategy.
"""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixtures.recordings import RECORDINGS
from tests.providers.conftest import check_contract, normalise_bytes
from tokenwire.fold import fold
from tokenwire.providers import (
    AnthropicNormaliser,
    GeminiNormaliser,
    Normaliser,
    OpenAIChatNormaliser,
    OpenAIResponsesNormaliser,
)
from tokenwire.schemas import Message, ReasoningDelta, RecordedError, TextDelta, ToolCallDelta

EXAMPLES = int(os.environ.get("TOKENWIRE_FUZZ_EXAMPLES", "30"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES <= 1000,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

ADAPTERS: dict[str, tuple[Callable[[], Normaliser], tuple[str, ...], tuple[str, ...]]] = {
    # name: (normaliser, recording folders, event names it knows)
    "openai-chat": (
        OpenAIChatNormaliser,
        ("openai", "deepseek", "groq", "openrouter", "vllm", "azure-openai"),
        ("message",),
    ),
    "anthropic": (
        AnthropicNormaliser,
        ("anthropic",),
        (
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
            "ping",
            "error",
        ),
    ),
    "gemini": (GeminiNormaliser, ("google",), ("message",)),
    "openai-responses": (
        OpenAIResponsesNormaliser,
        ("openai-responses",),
        (
            "response.created",
            "response.output_text.delta",
            "response.output_item.added",
            "response.output_item.done",
            "response.function_call_arguments.delta",
            "response.completed",
            "response.failed",
            "error",
        ),
    ),
}


@contextmanager
def reported(capsys: pytest.CaptureFixture[str], name: str) -> Iterator[list[int]]:
    """Counts the cases a test ran; under ``make fuzz`` (``TOKENWIRE_FUZZ_EXAMPLES`` set) prints
    them with their rate and the process's peak RSS so far, the long run's figures."""
    cases = [0]
    start = time.perf_counter()
    try:
        yield cases
    finally:  # also when the run is interrupted (a bounded long run ends with SIGINT)
        if "TOKENWIRE_FUZZ_EXAMPLES" in os.environ:
            took = time.perf_counter() - start
            peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            with capsys.disabled():
                print(
                    f"\nfuzz {name}: {cases[0]} cases in {took:.0f} s "
                    f"({cases[0] / took:.1f}/s), peak RSS {peak_mib:.0f} MiB"
                )


def recordings(folders: tuple[str, ...]) -> list[bytes]:
    if not RECORDINGS.is_dir():
        return []
    return [p.read_bytes() for f in folders for p in sorted((RECORDINGS / f).glob("*.sse"))]


def mutated(bodies: list[bytes]) -> st.SearchStrategy[bytes]:
    """A recording with byte-level edits: cut, duplicated or deleted ranges, random bytes."""

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        body = bytearray(draw(st.sampled_from(bodies)))
        for _ in range(draw(st.integers(1, 6))):
            at = draw(st.integers(0, len(body)))
            span = draw(st.integers(0, 64))
            match draw(st.sampled_from(["cut", "dup", "delete", "insert", "flip"])):
                case "cut":
                    del body[at:]
                case "dup":
                    body[at:at] = body[at : at + span]
                case "delete":
                    del body[at : at + span]
                case "insert":
                    body[at:at] = draw(st.binary(max_size=span))
                case _:
                    if at < len(body):
                        body[at] = draw(st.integers(0, 255))
        return bytes(body)

    return build()


def random_sse(event_names: tuple[str, ...]) -> st.SearchStrategy[bytes]:
    """SSE framing around JSON-ish data that uses the dialect's own keys."""
    keys = st.sampled_from(
        [
            "choices",
            "delta",
            "content",
            "tool_calls",
            "index",
            "id",
            "function",
            "arguments",
            "finish_reason",
            "usage",
            "type",
            "text",
            "partial_json",
            "candidates",
            "parts",
            "output_index",
            "item",
            "response",
            "error",
            "message",
            "thinking",
            "signature",
        ]
    )
    json_values = st.recursive(
        st.none() | st.booleans() | st.integers(-3, 10**6) | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5),
        max_leaves=25,
    )

    @st.composite
    def build(draw: st.DrawFn) -> bytes:
        import json

        out = []
        for _ in range(draw(st.integers(0, 25))):
            name = draw(st.sampled_from(event_names))
            data = draw(
                st.one_of(
                    json_values.map(json.dumps),
                    st.just("[DONE]"),
                    st.text(max_size=30),
                )
            )
            head = b"" if name == "message" else b"event: " + name.encode() + b"\n"
            sep = draw(st.sampled_from([b"\n\n", b"\r\n\r\n", b"\n"]))
            out.append(head + b"data: " + data.encode("utf-8", "surrogatepass") + sep)
        return b"".join(out)

    return build()


def check(body: bytes, make: Callable[[], Normaliser], cuts: list[int]) -> None:
    chunks = normalise_bytes(body, make(), sorted(min(c, len(body)) for c in cuts))
    check_contract(chunks)
    streamed = sum(
        len(c.text.encode("utf-8", "surrogatepass"))
        if isinstance(c, TextDelta | ReasoningDelta)
        else len(c.arguments_delta.encode("utf-8", "surrogatepass"))
        for c in chunks
        if isinstance(c, TextDelta | ReasoningDelta | ToolCallDelta)
    )
    assert streamed <= len(body), "an adapter made more content than it read"
    assert isinstance(fold(chunks), Message | RecordedError)


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_mutated_recordings_never_break_an_adapter(
    adapter: str, capsys: pytest.CaptureFixture[str]
) -> None:
    make, folders, _ = ADAPTERS[adapter]
    bodies = recordings(folders)
    if not bodies:
        if os.environ.get("CI"):
            pytest.fail(f"no recordings at {RECORDINGS}")
        pytest.skip(f"no recordings at {RECORDINGS} (set TOKENWIRE_RECORDINGS)")

    @FUZZ
    @given(body=mutated(bodies), cuts=st.lists(st.integers(0, 1 << 20), max_size=8))
    def run(body: bytes, cuts: list[int]) -> None:
        cases[0] += 1
        check(body, make, cuts)

    with reported(capsys, f"mutated {adapter}") as cases:
        run()


@pytest.mark.parametrize("adapter", sorted(ADAPTERS))
def test_random_sse_never_breaks_an_adapter(
    adapter: str, capsys: pytest.CaptureFixture[str]
) -> None:
    make, _, names = ADAPTERS[adapter]

    @FUZZ
    @given(body=random_sse(names), cuts=st.lists(st.integers(0, 1 << 16), max_size=8))
    def run(body: bytes, cuts: list[int]) -> None:
        cases[0] += 1
        check(body, make, cuts)

    with reported(capsys, f"random-sse {adapter}") as cases:
        run()
