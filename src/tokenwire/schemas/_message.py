"""The assembled assistant message and the recorded error of a failed step."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from tokenwire.schemas._blocks import ContentBlock, TextBlock, ToolCallBlock
from tokenwire.schemas._chunks import FinishReason
from tokenwire.schemas._usage import TokenUsage


class Message(msgspec.Struct, frozen=True):
    """An assistant message folded from one completed step.

    ``dropped_tool_calls`` lists the tool calls a ``max-tokens`` finish removed (their
    ``arguments`` are the truncated fragments received); ``ignored_deltas`` counts deltas that
    arrived for a block already closed by ``block-end`` (a misbehaving adapter);
    ``truncated_blocks`` lists the indexes of the blocks a truncating (``max-tokens``) finish
    cut while they were still open: their text and reasoning are kept as they stood.
    """

    content: list[ContentBlock]
    finish_reason: FinishReason
    role: Literal["assistant"] = "assistant"
    usage: TokenUsage | None = None
    replay_state: dict[str, Any] | None = None
    dropped_tool_calls: list[ToolCallBlock] = msgspec.field(default_factory=list)
    ignored_deltas: int = 0
    truncated_blocks: list[int] = msgspec.field(default_factory=list)

    @property
    def text(self) -> str:
        """The visible text of the message, blocks joined in order."""
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    @property
    def tool_calls(self) -> list[ToolCallBlock]:
        """The complete tool calls of the message, in block order."""
        return [b for b in self.content if isinstance(b, ToolCallBlock)]


StepErrorKind = Literal["provider", "aborted", "gap", "abandoned", "contract", "limit"]
"""Why a step produced no message.

- ``provider``: the stream ended with ``finish {error}`` (provider or transport failure).
- ``aborted``: the stream ended with ``finish {aborted}`` (the caller or gateway gave up).
- ``gap``: chunks of the step never arrived (an ordinal was missing when it had to close).
- ``abandoned``: no ``finish`` arrived within the abandon timeout (a crashed gateway).
- ``contract``: the chunks broke the adapter contract (e.g. a chunk after ``finish``).
- ``limit``: the step exceeded a fold bound (open blocks, bytes per step), or the gateway
  ended it at one of its bounds (``finish {error}`` with code ``tokenwire_limit``).
"""


class RecordedError(msgspec.Struct, frozen=True):
    """The record of a failed step: never a message."""

    kind: StepErrorKind
    message: str
    retryable: bool = False
    code: str | None = None
    usage: TokenUsage | None = None
