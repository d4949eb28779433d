"""Block bookkeeping shared by the normalisers: stable indexes, assembled content, block-end.

A normaliser opens a block when the provider starts one, appends fragments, and closes it; the
builder hands out indexes in opening order (0, 1, 2, ...) and assembles the block that
``block-end`` carries, so every normaliser obeys the same rules.
"""

from __future__ import annotations

from typing import Literal

from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    ContentBlock,
    ReasoningBlock,
    ReasoningDelta,
    StepError,
    StreamChunk,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallDelta,
)

OpenKind = Literal["text", "reasoning", "tool-call"]


class _Open:
    """A block being assembled."""

    __slots__ = ("call_id", "kind", "name", "parts", "redacted")

    def __init__(self, kind: OpenKind, call_id: str, name: str) -> None:
        self.kind: OpenKind = kind
        self.call_id = call_id
        self.name = name
        self.parts: list[str] = []
        self.redacted: str | None = None

    def block(self) -> ContentBlock:
        text = "".join(self.parts)
        if self.kind == "text":
            return TextBlock(text=text)
        if self.kind == "reasoning":
            return ReasoningBlock(text=text, redacted=self.redacted)
        return ToolCallBlock(id=self.call_id, name=self.name, arguments=text)


class BlockBuilder:
    """Open blocks by index; ``has_tool_calls`` remembers whether any tool call was opened."""

    __slots__ = ("_next", "_open", "has_tool_calls")

    def __init__(self) -> None:
        self._next = 0
        self._open: dict[int, _Open] = {}
        self.has_tool_calls = False

    def open(
        self, kind: OpenKind, out: list[StreamChunk], call_id: str = "", name: str = ""
    ) -> int:
        """Open a block of ``kind``; append its ``block-start`` to ``out``; return its index."""
        index = self._next
        self._next += 1
        self._open[index] = _Open(kind, call_id, name)
        self.has_tool_calls |= kind == "tool-call"
        out.append(BlockStart(index=index, block_type=kind))
        return index

    def text(self, index: int, fragment: str) -> StreamChunk:
        """Record a text or reasoning fragment of the block at ``index``; return its delta."""
        block = self._open[index]
        block.parts.append(fragment)
        if block.kind == "reasoning":
            return ReasoningDelta(index=index, text=fragment)
        return TextDelta(index=index, text=fragment)

    def arguments(self, index: int, fragment: str, with_name: bool = False) -> ToolCallDelta:
        """Record raw argument bytes of the tool call at ``index``; ``with_name`` on the first."""
        block = self._open[index]
        block.parts.append(fragment)
        name = block.name if with_name else None
        return ToolCallDelta(index=index, id=block.call_id, name=name, arguments_delta=fragment)

    def assembled(self, index: int) -> str:
        """The fragments of the open block at ``index`` so far, joined."""
        return "".join(self._open[index].parts)

    def set_redacted(self, index: int, payload: str | None) -> None:
        """Attach the provider's opaque reasoning payload to the reasoning block at ``index``."""
        self._open[index].redacted = payload

    def is_open(self, index: int) -> bool:
        """Whether the block at ``index`` was opened and not yet closed."""
        return index in self._open

    def close(self, index: int, out: list[StreamChunk]) -> None:
        """Close the block at ``index`` (if open), appending its ``block-end`` to ``out``."""
        block = self._open.pop(index, None)
        if block is not None:
            out.append(BlockEnd(index=index, block=block.block()))

    def close_all(self, out: list[StreamChunk]) -> None:
        """Close every open block, in index order."""
        for index in sorted(self._open):
            self.close(index, out)


def step_error(message: str, retryable: bool, code: str | None) -> StepError:
    """A :class:`StepError`, with an empty provider message replaced by a useful one."""
    return StepError(
        message=message or "provider reported an error", retryable=retryable, code=code
    )
