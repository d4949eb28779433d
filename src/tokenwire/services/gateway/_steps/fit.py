"""Fitting chunks into broker messages: a delta too large for one message is split, a
block-end too large goes by reference to the deltas already published (ADR 0012).

The broker refuses a message over its ``max_payload`` (headers counted). Two kinds of chunk
can reach that size:

- a delta (text, reasoning, tool-call arguments): split into consecutive deltas of the same
  index, each under the room; the fold concatenates them into the same content;
- a block-end: it repeats the content its deltas carried, so it is sent with that content left
  out and ``by_reference`` set, once :class:`DeltaLedger` confirms that the deltas published
  at its index hold exactly that content (same UTF-8 length and CRC-32). The log keeps one
  copy of the block: its deltas.

Anything else too large (a block-end whose content differs from its deltas, a block kind
that never streams, a huge ``replay_state``) cannot be carried: :class:`ChunkTooLarge`.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import assert_never

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

Fits = Callable[[StreamChunk], bool]
"""Whether a chunk, in its envelope, fits in one broker message."""


class ChunkTooLarge(Exception):  # noqa: N818 - a condition, like the broker's PayloadTooLarge
    """A chunk that cannot be carried in broker messages of the connected server's size."""


class DeltaLedger:
    """The UTF-8 length and CRC-32 of the streamed content published per open block index.

    ~0.2 us a delta; it is what lets a large block-end go by reference safely.
    """

    __slots__ = ("_closed", "_open")

    def __init__(self) -> None:
        self._open: dict[int, tuple[int, int]] = {}
        self._closed: set[int] = set()

    def note(self, chunk: StreamChunk) -> None:
        """Account a chunk just published (deltas add content, a block-end closes its index)."""
        if type(chunk) is TextDelta or type(chunk) is ReasoningDelta:  # the common case, unmatched
            self._add(chunk.index, chunk.text)  # (0.45 against 0.75 us: docs/benchmarks.md)
            return
        match chunk:
            case TextDelta(index=index, text=text) | ReasoningDelta(index=index, text=text):
                self._add(index, text)
            case ToolCallDelta(index=index, arguments_delta=text):
                self._add(index, text)
            case BlockEnd(index=index):
                self._open.pop(index, None)
                self._closed.add(index)
            case BlockStart() | Usage() | Finish():
                pass
            case _:
                assert_never(chunk)

    def _add(self, index: int, text: str) -> None:
        if not text or index in self._closed:
            return  # the fold ignores both
        data = text.encode("utf-8", "surrogatepass")
        size, crc = self._open.get(index, (0, 0))
        self._open[index] = (size + len(data), zlib.crc32(data, crc))

    def holds(self, index: int, content: str) -> bool:
        """Whether the deltas published at ``index`` concatenate to exactly ``content``."""
        data = content.encode("utf-8", "surrogatepass")
        return self._open.get(index, (0, 0)) == (len(data), zlib.crc32(data))


def fitted(chunk: StreamChunk, fits: Fits, ledger: DeltaLedger) -> list[StreamChunk]:
    """The chunks to publish in place of ``chunk``, each fitting; ChunkTooLarge if none do."""
    if fits(chunk):
        return [chunk]
    match chunk:
        case TextDelta() | ReasoningDelta() | ToolCallDelta():
            return _split(chunk, fits)
        case BlockEnd():
            return [_by_reference(chunk, fits, ledger)]
        case BlockStart() | Usage() | Finish():
            raise ChunkTooLarge(f"a {_tag(chunk)} chunk larger than one broker message")
        case _:
            assert_never(chunk)


def _split(chunk: TextDelta | ReasoningDelta | ToolCallDelta, fits: Fits) -> list[StreamChunk]:
    """Halve the delta's text until every piece fits (O(n log n) encoding, for rare chunks)."""
    text = chunk.arguments_delta if isinstance(chunk, ToolCallDelta) else chunk.text
    if len(text) < 2:
        raise ChunkTooLarge(f"a {_tag(chunk)} chunk larger than one broker message")
    mid = len(text) // 2
    pieces: list[StreamChunk] = []
    for part, first in ((text[:mid], True), (text[mid:], False)):
        piece = _with_text(chunk, part, first)
        pieces += [piece] if fits(piece) else _split(piece, fits)
    return pieces


def _with_text(
    chunk: TextDelta | ReasoningDelta | ToolCallDelta, text: str, first: bool
) -> TextDelta | ReasoningDelta | ToolCallDelta:
    match chunk:
        case TextDelta(index=index):
            return TextDelta(index, text)
        case ReasoningDelta(index=index):
            return ReasoningDelta(index, text)
        case ToolCallDelta(index=index, id=id_, name=name):
            return ToolCallDelta(index, id_, name if first else None, text)
        case _:
            assert_never(chunk)


def _by_reference(chunk: BlockEnd, fits: Fits, ledger: DeltaLedger) -> BlockEnd:
    streamed = _streamed_content(chunk.block)
    if streamed is None:
        raise ChunkTooLarge(f"a {_tag(chunk.block)} block larger than one broker message")
    if not ledger.holds(chunk.index, streamed):
        raise ChunkTooLarge(
            f"block {chunk.index} is larger than one broker message and its content differs "
            "from the deltas it streamed"
        )
    reference = BlockEnd(chunk.index, _without_content(chunk.block), by_reference=True)
    if not fits(reference):
        raise ChunkTooLarge(f"block {chunk.index}'s fields beside its content exceed a message")
    return reference


def _streamed_content(block: ContentBlock) -> str | None:
    """The part of a block its deltas carry; None for kinds that never stream."""
    match block:
        case TextBlock(text=text) | ReasoningBlock(text=text):
            return text
        case ToolCallBlock(arguments=arguments):
            return arguments
        case ToolResultBlock() | ImageBlock():
            return None
        case _:
            assert_never(block)


def _without_content(block: ContentBlock) -> ContentBlock:
    match block:
        case TextBlock():
            return TextBlock("")
        case ReasoningBlock(signature=signature, redacted=redacted):
            return ReasoningBlock("", signature, redacted)
        case ToolCallBlock(id=id_, name=name):
            return ToolCallBlock(id_, name, "")
        case ToolResultBlock() | ImageBlock():
            return block
        case _:
            assert_never(block)


def _tag(value: StreamChunk | ContentBlock) -> str:
    return str(value.__struct_config__.tag)
