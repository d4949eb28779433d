"""Content blocks: the assembled units of an assistant message."""

from __future__ import annotations

from typing import Literal

import msgspec

BlockType = Literal["text", "reasoning", "tool-call", "tool-result", "image"]


class TextBlock(msgspec.Struct, tag="text", tag_field="type", frozen=True, omit_defaults=True):
    """Visible text."""

    text: str


class ReasoningBlock(
    msgspec.Struct, tag="reasoning", tag_field="type", frozen=True, omit_defaults=True
):
    """Reasoning (thinking) text.

    ``signature`` is the provider's integrity token for the text (Anthropic's thinking
    signature, Gemini's thought signature); ``redacted`` holds the opaque payload of a redacted
    block, whose ``text`` is then empty. Both are opaque: stored, sent back, never read.
    """

    text: str
    signature: str | None = None
    redacted: str | None = None


class ToolCallBlock(
    msgspec.Struct, tag="tool-call", tag_field="type", frozen=True, omit_defaults=True
):
    """A complete tool call. ``arguments`` is the raw JSON string, parsed once at dispatch."""

    id: str
    name: str
    arguments: str


class ToolResultBlock(
    msgspec.Struct, tag="tool-result", tag_field="type", frozen=True, omit_defaults=True
):
    """The result of a tool call, as sent back to the model."""

    tool_call_id: str
    content: str
    is_error: bool = False


class ImageBlock(msgspec.Struct, tag="image", tag_field="type", frozen=True, omit_defaults=True):
    """An image, inline (base64 ``data``) or by ``url``."""

    media_type: str
    data: str | None = None
    url: str | None = None


ContentBlock = TextBlock | ReasoningBlock | ToolCallBlock | ToolResultBlock | ImageBlock
"""The closed union of content blocks, tagged by ``type``."""
