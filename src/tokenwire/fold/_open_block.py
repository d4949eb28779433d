"""One open block being accumulated from deltas, and the byte sizes the bounds count."""

from __future__ import annotations

from typing import assert_never

from tokenwire.schemas import (
    BlockType,
    ContentBlock,
    ImageBlock,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)

RUN_LENGTH = 256
"""Fragments joined into one run string once this many are pending.

Keeping every fragment alive would cost ~50 bytes of object header per 4-byte token and pin
the decoded chunks; joining runs keeps the accumulation near its text size while each
fragment is still appended to a list (never ``+=`` on a str, which is quadratic).
"""


class Acc:
    """The fragments of one open block at ``index`` of kind ``kind``.

    ``parts`` holds recent fragments, ``runs`` joined runs of ``RUN_LENGTH`` of them; their
    concatenation, in order, is the block's text (or a tool call's arguments). ``dropped``
    counts the UTF-8 bytes received and not kept (a fold that does not keep text).
    """

    __slots__ = ("dropped", "id", "index", "kind", "name", "parts", "runs")

    def __init__(self, index: int, kind: BlockType) -> None:
        self.index = index
        self.kind: BlockType = kind
        self.parts: list[str] = []
        self.runs: list[str] = []
        self.id = ""
        self.name = ""
        self.dropped = 0

    def compact(self) -> None:
        """Join the pending fragments into one run."""
        self.runs.append("".join(self.parts))
        self.parts.clear()

    def text(self) -> str:
        """Everything received so far, joined."""
        if self.runs:
            return "".join([*self.runs, *self.parts])
        return "".join(self.parts)

    def size(self) -> int:
        """UTF-8 bytes received so far."""
        return sum(map(utf8_len, self.runs)) + sum(map(utf8_len, self.parts)) + self.dropped

    def partial(self) -> TextBlock | ReasoningBlock | None:
        """The block so far when it may be shown before it ends (text, reasoning), else None."""
        if self.kind == "text":
            return TextBlock(self.text())
        if self.kind == "reasoning":
            return ReasoningBlock(self.text())
        return None

    def tool_call(self) -> ToolCallBlock:
        """The tool call received so far (complete only when the step finished normally)."""
        return ToolCallBlock(id=self.id, name=self.name, arguments=self.text())


def utf8_len(s: str) -> int:
    """UTF-8 length of ``s`` without encoding it when it is ASCII (``isascii`` is O(1))."""
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))


BLOCK_KIND: dict[type, BlockType] = {
    TextBlock: "text",
    ReasoningBlock: "reasoning",
    ToolCallBlock: "tool-call",
    ToolResultBlock: "tool-result",
    ImageBlock: "image",
}
"""The tag of each content block type."""


def block_size(block: ContentBlock) -> int:
    """UTF-8 bytes of the strings an ended block holds (what the byte bound counts)."""
    match block:
        case TextBlock(text=text):
            return utf8_len(text)
        case ReasoningBlock(text=text, signature=sig, redacted=red):
            return utf8_len(text) + utf8_len(sig or "") + utf8_len(red or "")
        case ToolCallBlock(id=id_, name=name, arguments=args):
            return utf8_len(id_) + utf8_len(name) + utf8_len(args)
        case ToolResultBlock(tool_call_id=id_, content=content):
            return utf8_len(id_) + utf8_len(content)
        case ImageBlock(data=data, url=url):
            return utf8_len(data or "") + utf8_len(url or "")
        case _:
            assert_never(block)
