"""The stream chunk union: what every provider adapter emits and every consumer folds.

Version 1 of the wire contract. Evolve it additively only: new fields get defaults, nothing is
retyped, renamed or reordered (see docs/adr/0003-wire-contract.md).
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from tokenwire.schemas._blocks import BlockType, ContentBlock
from tokenwire.schemas._usage import TokenUsage

FinishReason = Literal[
    "stop", "tool-calls", "max-tokens", "content-filter", "refusal", "error", "aborted"
]
"""Why a step ended. ``error`` always comes with a :class:`StepError`."""

FINISH_REASONS: tuple[FinishReason, ...] = (
    "stop",
    "tool-calls",
    "max-tokens",
    "content-filter",
    "refusal",
    "error",
    "aborted",
)


class StepError(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """What went wrong when a step ends with ``finish {error}``.

    ``code`` is the provider's own error code or type when it sent one (``overloaded_error``,
    ``insufficient_quota``), ``retryable`` whether sending the same request again may succeed.
    """

    message: str
    retryable: bool = False
    code: str | None = None


LIMIT_ERROR_CODE = "tokenwire_limit"
"""The ``StepError.code`` of a step the gateway ended at one of its bounds (a step's bytes,
chunks or seconds, a chunk too large for the broker): folded as ``RecordedError(kind="limit")``
rather than ``provider``."""


class BlockStart(
    msgspec.Struct, tag="block-start", tag_field="type", frozen=True, omit_defaults=True
):
    """A content block opens at ``index``. Optional: delta-only protocols never send it."""

    index: int
    block_type: BlockType


class TextDelta(
    msgspec.Struct, tag="text-delta", tag_field="type", frozen=True, omit_defaults=True
):
    """A fragment of visible text for the block at ``index``."""

    index: int
    text: str


class ReasoningDelta(
    msgspec.Struct, tag="reasoning-delta", tag_field="type", frozen=True, omit_defaults=True
):
    """A fragment of reasoning (thinking) text for the block at ``index``."""

    index: int
    text: str


class ToolCallDelta(
    msgspec.Struct, tag="tool-call-delta", tag_field="type", frozen=True, omit_defaults=True
):
    """A fragment of a tool call. ``name`` usually arrives only on the first fragment.

    ``arguments_delta`` is a piece of a raw JSON string: never parse it on its own.
    """

    index: int
    id: str
    name: str | None = None
    arguments_delta: str = ""


class BlockEnd(msgspec.Struct, tag="block-end", tag_field="type", frozen=True, omit_defaults=True):
    """The block at ``index`` is complete; ``block`` is its fully assembled content.

    ``by_reference`` (added in schema version 1, default false): the block's streamed content
    (a text or reasoning block's ``text``, a tool call's ``arguments``) is left out of ``block``
    (empty) and is the concatenation of the step's deltas at ``index``, which the log already
    holds. The gateway writes it only when the whole block would not fit in one broker
    message (docs/adr/0012-large-blocks-by-reference.md); every other field of ``block``
    (signature, id, name) is carried as usual.
    """

    index: int
    block: ContentBlock
    by_reference: bool = False


class Usage(msgspec.Struct, tag="usage", tag_field="type", frozen=True, omit_defaults=True):
    """Token usage of the step. Comes before ``finish``."""

    usage: TokenUsage


class Finish(msgspec.Struct, tag="finish", tag_field="type", frozen=True, omit_defaults=True):
    """The step is over. Nothing may follow it.

    ``replay_state`` is opaque provider state needed to send the conversation back to that
    provider (response ids, encrypted reasoning); consumers store it and never interpret it.
    """

    reason: FinishReason
    error: StepError | None = None
    replay_state: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if (self.reason == "error") != (self.error is not None):
            raise ValueError("finish carries an error exactly when its reason is 'error'")


StreamChunk = BlockStart | TextDelta | ReasoningDelta | ToolCallDelta | BlockEnd | Usage | Finish
"""The closed union of stream chunks, tagged by ``type``."""
