"""The bounds of one step in the gateway: its content bytes, its chunks and its seconds.

A provider can stream for ever; past a bound the step ends as a recorded ``limit`` error and
the caller is told in its dialect (``StepRun.stop_at_limit``). The byte bound counts what the
fold's ``max_step_bytes`` counts (the streamed text, reasoning and tool-call arguments, the
other strings of ended blocks, tool-call ids and names) and never less, so with the same
number the gateway ends a step no later than the assembler's fold would: the caller and the
store agree. The chunk bound keeps a step under the assembler consumer's ``max_ack_pending``
(a step longer than that would hold its partition's other sessions back).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import assert_never

from tokenwire.fold import DEFAULT_LIMITS, FoldLimits
from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    ContentBlock,
    Finish,
    ImageBlock,
    ReasoningBlock,
    ReasoningDelta,
    StreamChunk,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallDelta,
    ToolResultBlock,
    Usage,
)
from tokenwire.variables import (
    GATEWAY_MAX_STEP_BYTES,
    GATEWAY_MAX_STEP_CHUNKS,
    GATEWAY_MAX_STEP_IDLE_SECONDS,
    GATEWAY_MAX_STEP_SECONDS,
)

DEFAULT_MAX_STEP_BYTES = GATEWAY_MAX_STEP_BYTES.value
"""The fold's own step byte bound (``fold.DEFAULT_LIMITS``; a test holds them equal)."""
DEFAULT_MAX_STEP_CHUNKS = GATEWAY_MAX_STEP_CHUNKS.value
DEFAULT_MAX_STEP_SECONDS = GATEWAY_MAX_STEP_SECONDS.value
DEFAULT_MAX_STEP_IDLE_SECONDS = GATEWAY_MAX_STEP_IDLE_SECONDS.value
"""Below the assembler's ``abandon_timeout_s`` (120 s): a provider that keeps the connection
open without sending a chunk (keep-alive bytes only) is ended by the gateway, with the caller
told, before the assembler would record the step ``abandoned``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepBounds:
    """``max_bytes`` of content, ``max_chunks`` published chunks, ``max_seconds`` from the
    request, ``max_idle_seconds`` without a chunk; see the module docstring. The fold's block
    bounds (``max_open_blocks``, ``max_blocks``) are the assemblers' defaults."""

    max_bytes: int = DEFAULT_MAX_STEP_BYTES
    max_chunks: int = DEFAULT_MAX_STEP_CHUNKS
    max_seconds: float = DEFAULT_MAX_STEP_SECONDS
    max_idle_seconds: float = DEFAULT_MAX_STEP_IDLE_SECONDS
    max_open_blocks: int = DEFAULT_LIMITS.max_open_blocks
    max_blocks: int = DEFAULT_LIMITS.max_blocks

    def fold_limits(self) -> FoldLimits:
        """The fold's limits at these bounds (the meter ends a step before they are reached)."""
        return FoldLimits(
            max_open_blocks=self.max_open_blocks,
            max_blocks=self.max_blocks,
            max_step_bytes=self.max_bytes,
        )


class StepMeter:
    """Counts one step against its :class:`StepBounds`; :meth:`over` names a crossed bound."""

    __slots__ = ("_bounds", "_bytes", "_ended", "_streamed")

    def __init__(self, bounds: StepBounds) -> None:
        self._bounds = bounds
        self._bytes = 0
        self._streamed: dict[int, int] = {}  # open blocks: bytes streamed
        self._ended: set[int] = set()

    def over(self, chunk: StreamChunk, ordinal: int) -> str | None:
        """Account ``chunk`` (about to be published as ``ordinal``): the crossed bound or None.

        Never raises; a finish is always let through (it ends the step anyway).
        """
        bounds = self._bounds
        if type(chunk) is Finish:
            return None
        if ordinal >= bounds.max_chunks - 1:  # room for the finish that ends it
            return f"the step exceeded max_step_chunks ({bounds.max_chunks})"
        if type(chunk) is TextDelta or type(chunk) is ReasoningDelta:  # no match, no union
            text = chunk.text
            self._bytes += self._stream(chunk.index, len(text) if text.isascii() else _utf8(text))
        else:
            self._bytes += self._size(chunk)
        if self._bytes > bounds.max_bytes:
            return f"the step exceeded max_step_bytes ({bounds.max_bytes} bytes)"
        opened = len(self._streamed)
        if opened > bounds.max_open_blocks:
            return f"the step exceeded max_open_blocks ({bounds.max_open_blocks})"
        if opened + len(self._ended) > bounds.max_blocks:
            return f"the step exceeded max_blocks ({bounds.max_blocks})"
        return None

    def _size(self, chunk: StreamChunk) -> int:
        match chunk:
            case TextDelta(index=index, text=text) | ReasoningDelta(index=index, text=text):
                return self._stream(index, _utf8(text))
            case ToolCallDelta(index=index, id=id_, name=name, arguments_delta=args):
                return self._stream(index, _utf8(args)) + _utf8(id_) + _utf8(name or "")
            case BlockEnd(index=index, block=block):
                if index in self._ended:
                    return 0  # the fold ignores it
                self._ended.add(index)
                return max(0, _block_size(block) - self._streamed.pop(index, 0))
            case BlockStart(index=index):
                return self._stream(index, 0)
            case Usage() | Finish():
                return 0
            case _:
                assert_never(chunk)

    def _stream(self, index: int, n: int) -> int:
        if index not in self._ended:
            self._streamed[index] = self._streamed.get(index, 0) + n
        return n


def _utf8(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))


def _block_size(block: ContentBlock) -> int:
    match block:
        case TextBlock(text=text):
            return _utf8(text)
        case ReasoningBlock(text=text, signature=sig, redacted=red):
            return _utf8(text) + _utf8(sig or "") + _utf8(red or "")
        case ToolCallBlock(id=id_, name=name, arguments=args):
            return _utf8(id_) + _utf8(name) + _utf8(args)
        case ToolResultBlock(tool_call_id=id_, content=content):
            return _utf8(id_) + _utf8(content)
        case ImageBlock(data=data, url=url):
            return _utf8(data or "") + _utf8(url or "")
        case _:
            assert_never(block)
