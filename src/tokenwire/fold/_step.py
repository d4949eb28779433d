"""StepFold: the one fold of a step's chunks (in ordinal order) into a message or an error."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal, assert_never, get_args

from tokenwire.fold._errors import ChunkAfterFinish, StepStateError
from tokenwire.fold._limits import DEFAULT_LIMITS, FoldLimits
from tokenwire.fold._open_block import BLOCK_KIND, RUN_LENGTH, Acc, block_size, utf8_len
from tokenwire.schemas import (
    LIMIT_ERROR_CODE,
    BlockEnd,
    BlockStart,
    BlockType,
    ContentBlock,
    Finish,
    ImageBlock,
    Message,
    ReasoningBlock,
    ReasoningDelta,
    RecordedError,
    StepError,
    StepErrorKind,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallBlock,
    ToolCallDelta,
    ToolResultBlock,
    Usage,
)

_Handler = Callable[["StepFold", Any], None]
CHUNK_TYPES: tuple[type, ...] = get_args(StreamChunk)


class StepFold:
    """The incremental fold of one step: feed its chunks in ordinal order, then take the result.

    Rules (docs/fold.md): deltas are correlated to blocks by ``index`` (blocks may interleave);
    ``block-start``/``block-end`` are optional; a ``block-end`` carries the authoritative block
    (one ``by_reference`` takes its streamed content from the deltas received at its index);
    chunks for an index already ended are ignored and counted (``ignored_deltas``); an empty
    delta changes nothing; a later ``usage`` replaces an earlier one; a ``max-tokens`` finish
    (a truncating one) closes the text and reasoning blocks still open as they stand, lists
    every block it found open in ``Message.truncated_blocks`` and drops every tool call into
    ``Message.dropped_tool_calls``; ``finish {error|aborted}`` gives
    a :class:`RecordedError`, never a message. A contract break inside the step (a text delta
    for a tool-call block, a second tool call spliced into an index) or an exceeded
    :class:`FoldLimits` bound ends the step as ``RecordedError(kind="contract"|"limit")``: the
    fold then drops what it holds and only waits for ``finish``. A chunk after the step ended
    raises :class:`ChunkAfterFinish` and changes nothing.

    ``keep_text=False`` folds by the same rules and bounds (every byte counted, every block
    checked) but keeps no text or reasoning: the result's text and reasoning blocks are
    empty. For a reader that showed them as they streamed (the session events feed), so that
    what it holds per open step is its tool calls, not its text.

    >>> step = StepFold()
    >>> step.feed(TextDelta(index=0, text="Hel"))
    >>> step.feed(TextDelta(index=0, text="lo"))
    >>> step.feed(Finish(reason="stop"))
    >>> step.result().text
    'Hello'
    """

    __slots__ = (
        "_bytes",
        "_closed",
        "_dispatch",
        "_ended_by",
        "_failure",
        "_ignored",
        "_keep_text",
        "_limits",
        "_max_bytes",
        "_open",
        "_result",
        "_usage",
    )

    def __init__(self, limits: FoldLimits = DEFAULT_LIMITS, *, keep_text: bool = True) -> None:
        self._limits = limits
        self._max_bytes = limits.max_step_bytes
        self._keep_text = keep_text
        self._dispatch: dict[type, _Handler] = _ACCUMULATING if keep_text else _COUNTING
        self._open: dict[int, Acc] = {}
        self._closed: dict[int, ContentBlock] = {}
        self._bytes = 0
        self._usage: TokenUsage | None = None
        self._ignored = 0
        self._failure: tuple[StepErrorKind, str] | None = None
        self._result: Message | RecordedError | None = None
        self._ended_by = ""

    # -- public API ------------------------------------------------------------------------

    def feed(self, chunk: StreamChunk) -> None:
        """Fold the next chunk of the step (ordinal order). Raises ChunkAfterFinish once ended."""
        try:
            handler = self._dispatch[type(chunk)]
        except KeyError:
            raise TypeError(f"not a StreamChunk: {type(chunk).__name__}") from None
        handler(self, chunk)

    @property
    def finished(self) -> bool:
        """Whether the step ended: a ``finish`` was fed or :meth:`fail` was called."""
        return self._result is not None

    @property
    def failure(self) -> tuple[StepErrorKind, str] | None:
        """Why the step already failed before its finish (``contract`` or ``limit``, and the
        message its result will carry), or None. Set by the chunk that broke a rule."""
        return self._failure

    @property
    def ignored_deltas(self) -> int:
        """Chunks ignored because their index was already ended by ``block-end``."""
        return self._ignored

    def result(self) -> Message | RecordedError:
        """The step's outcome. Raises StepStateError before the step ended."""
        if self._result is None:
            raise StepStateError("the step has not ended: feed its finish or call fail()")
        return self._result

    def fail(self, kind: Literal["gap", "abandoned"], message: str) -> RecordedError:
        """End the step without its finish (chunks missing, or none came in time).

        If the step had already failed (``limit``/``contract``) that first cause is recorded
        instead. Raises StepStateError when the step already ended.
        """
        if self._result is not None:
            raise StepStateError(f"the step already ended ({self._ended_by})")
        cause_kind, cause = self._failure or (kind, message)
        error = RecordedError(kind=cause_kind, message=cause, usage=self._usage)
        self._end(kind, error)
        return error

    def snapshot(self) -> list[ContentBlock]:
        """The blocks so far, in index order, partial text included, tool calls never.

        A tool call exists only in the result of a normally finished step, so a viewer can
        never act on a fragment. After a contract or limit failure the snapshot is empty.
        """
        if self._result is not None:
            if isinstance(self._result, Message):
                return [b for b in self._result.content if not isinstance(b, ToolCallBlock)]
            return []
        blocks: list[ContentBlock] = []
        for index in sorted(self._open.keys() | self._closed.keys()):
            closed = self._closed.get(index)
            block = closed if closed is not None else self._open[index].partial()
            if block is not None and not isinstance(block, ToolCallBlock):
                blocks.append(block)
        return blocks

    # -- accumulating ------------------------------------------------------------------------

    def _on_start(self, chunk: BlockStart) -> None:
        acc = self._open.get(chunk.index)
        if acc is None:
            if chunk.index in self._closed:
                self._ignored += 1
            else:
                self._open_block(chunk.index, chunk.block_type)
        elif acc.kind != chunk.block_type:
            self._violate(f"block-start {chunk.block_type} for the {acc.kind} block {acc.index}")

    def _on_tool_call(self, chunk: ToolCallDelta) -> None:
        args = chunk.arguments_delta
        name = chunk.name
        if not args and not name:
            return  # an empty delta: the id alone is repeated on every fragment anyway
        acc = self._open.get(chunk.index)
        if acc is None or acc.kind != "tool-call":
            acc = self._acc_for(chunk.index, "tool-call")
            if acc is None:
                return
        new_identity = (chunk.id and chunk.id != acc.id) or (name and name != acc.name)
        if new_identity and not self._identify(acc, chunk.id, name):
            return
        if args:
            acc.parts.append(args)
            self._bytes += utf8_len(args)
            if self._bytes > self._max_bytes:
                self._exceeded_bytes()
            elif len(acc.parts) >= RUN_LENGTH:
                acc.compact()

    def _on_end(self, chunk: BlockEnd) -> None:
        index, block = chunk.index, chunk.block
        if index in self._closed:
            self._ignored += 1
            return
        acc = self._open.pop(index, None)
        if acc is None:
            if not self._room_for_block(index, opening=False):
                return
            received = 0
        elif acc.kind != BLOCK_KIND[type(block)]:
            self._violate(f"block-end {BLOCK_KIND[type(block)]} for the {acc.kind} block {index}")
            return
        else:
            received = acc.size()
        if chunk.by_reference:
            block = _with_streamed_content(block, acc)
        size = block_size(block)
        if not self._keep_text:
            block = _without_text(block)
        self._closed[index] = block
        self._grow(size - received)

    def _on_usage(self, chunk: Usage) -> None:
        self._usage = chunk.usage

    def _on_finish(self, chunk: Finish) -> None:
        result: Message | RecordedError
        match chunk.reason:
            case "error":
                result = self._provider_error(chunk.error)
            case "aborted":
                result = RecordedError(
                    "aborted", "the stream ended with finish aborted", usage=self._usage
                )
            case "max-tokens":
                result = self._message(chunk, drop_tool_calls=True)
            case "stop" | "tool-calls" | "content-filter" | "refusal":
                result = self._message(chunk, drop_tool_calls=False)
            case _:
                assert_never(chunk.reason)
        self._end("finish", result)

    # -- slow paths ------------------------------------------------------------------------

    def _acc_for(self, index: int, kind: BlockType) -> Acc | None:
        """The open block a ``kind`` delta at ``index`` goes to, or None to drop the delta."""
        acc = self._open.get(index)
        if acc is not None:
            self._violate(f"{kind} delta for the {acc.kind} block {index}")
            return None
        if index in self._closed:
            self._ignored += 1
            return None
        return self._open_block(index, kind)

    def _open_block(self, index: int, kind: BlockType) -> Acc | None:
        if not self._room_for_block(index, opening=True):
            return None
        acc = self._open[index] = Acc(index, kind)
        return acc

    def _room_for_block(self, index: int, *, opening: bool) -> bool:
        limits = self._limits
        if opening and len(self._open) >= limits.max_open_blocks:
            self._fail_step(
                "limit",
                f"step exceeded max_open_blocks: block {index} would be open block "
                f"{len(self._open) + 1}, limit {limits.max_open_blocks}",
            )
            return False
        if len(self._open) + len(self._closed) >= limits.max_blocks:
            self._fail_step(
                "limit",
                f"step exceeded max_blocks: block {index} would be block "
                f"{len(self._open) + len(self._closed) + 1}, limit {limits.max_blocks}",
            )
            return False
        return True

    def _identify(self, acc: Acc, id_: str, name: str | None) -> bool:
        """Record a tool call's id and name; a different one means two calls spliced."""
        for field, new in (("id", id_), ("name", name)):
            old = getattr(acc, field)
            if new and old and new != old:
                self._violate(f"tool call {acc.index} changed {field} from {old!r} to {new!r}")
                return False
            if new and not old:
                setattr(acc, field, new)
                if not self._grow(utf8_len(new)):
                    return False
        return True

    def _grow(self, n: int) -> bool:
        self._bytes += n
        if self._bytes > self._max_bytes:
            self._exceeded_bytes()
            return False
        return True

    def _exceeded_bytes(self) -> None:
        self._fail_step(
            "limit",
            f"step exceeded max_step_bytes: {self._bytes} bytes, limit {self._max_bytes}",
        )

    def _violate(self, message: str) -> None:
        self._fail_step("contract", message)

    def _fail_step(self, kind: StepErrorKind, message: str) -> None:
        """Stop accumulating: drop what the step holds and wait for its finish."""
        if self._failure is None:
            self._failure = (kind, message)
        self._open.clear()
        self._closed.clear()
        self._dispatch = _FAILED

    # -- ending ----------------------------------------------------------------------------

    def _message(self, finish: Finish, *, drop_tool_calls: bool) -> Message | RecordedError:
        content: list[ContentBlock] = []
        dropped: list[ToolCallBlock] = []
        cut = sorted(self._open) if drop_tool_calls else []
        for index in sorted(self._open.keys() | self._closed.keys()):
            closed = self._closed.get(index)
            block = closed if closed is not None else _built(self._open[index])
            if block is None:
                return self._contract_error(f"block {index} ({self._open[index].kind}) never ended")
            if isinstance(block, ToolCallBlock):
                if drop_tool_calls:
                    dropped.append(block)
                    continue
                if not block.name:
                    return self._contract_error(f"tool call {index} never received a name")
            content.append(block)
        return Message(
            content=content,
            finish_reason=finish.reason,
            usage=self._usage,
            replay_state=finish.replay_state,
            dropped_tool_calls=dropped,
            ignored_deltas=self._ignored,
            truncated_blocks=cut,
        )

    def _provider_error(self, error: StepError | None) -> RecordedError:
        if error is None:  # Finish.__post_init__ rules this out; kept total for the type checker
            return RecordedError("provider", "finish error without details", usage=self._usage)
        kind: StepErrorKind = "limit" if error.code == LIMIT_ERROR_CODE else "provider"
        return RecordedError(kind, error.message, error.retryable, error.code, self._usage)

    def _contract_error(self, message: str) -> RecordedError:
        return RecordedError(kind="contract", message=message, usage=self._usage)

    def _finish_failed(self, chunk: Finish) -> None:
        kind, message = self._failure or ("contract", "failed step")
        self._end("finish", RecordedError(kind=kind, message=message, usage=self._usage))

    def _end(self, ended_by: str, result: Message | RecordedError) -> None:
        self._result = result
        self._ended_by = ended_by
        self._open.clear()
        self._closed.clear()
        self._dispatch = _ENDED

    def _skip(self, chunk: StreamChunk) -> None:
        """After a contract or limit failure: keep nothing until the finish."""

    def _after_end(self, chunk: StreamChunk) -> None:
        raise ChunkAfterFinish(str(chunk.__struct_config__.tag), self._ended_by)


def _counting_handler(kind: Literal["text", "reasoning"]) -> _Handler:
    """Text and reasoning deltas for a fold that keeps no text: counted, checked, dropped."""

    def on_delta(fold: StepFold, chunk: TextDelta | ReasoningDelta) -> None:
        text = chunk.text
        if not text:
            return
        acc = fold._open.get(chunk.index)
        if acc is None or acc.kind != kind:
            acc = fold._acc_for(chunk.index, kind)
            if acc is None:
                return
        size = len(text) if text.isascii() else utf8_len(text)
        acc.dropped += size
        fold._grow(size)

    return on_delta


def _without_text(block: ContentBlock) -> ContentBlock:
    """A text or reasoning block's fields without its text (other blocks as they are)."""
    match block:
        case TextBlock():
            return TextBlock("")
        case ReasoningBlock(signature=signature, redacted=redacted):
            return ReasoningBlock("", signature, redacted)
        case ToolCallBlock() | ToolResultBlock() | ImageBlock():
            return block
        case _:
            assert_never(block)


def _text_handler(kind: Literal["text", "reasoning"]) -> _Handler:
    """The hot path for text and reasoning deltas (one closure each, no per-chunk allocation)."""

    def on_delta(fold: StepFold, chunk: TextDelta | ReasoningDelta) -> None:
        text = chunk.text
        if not text:
            return  # an empty delta changes nothing, and opens nothing
        acc = fold._open.get(chunk.index)
        if acc is None or acc.kind != kind:
            acc = fold._acc_for(chunk.index, kind)
            if acc is None:
                return
        parts = acc.parts
        parts.append(text)
        fold._bytes += len(text) if text.isascii() else utf8_len(text)
        if fold._bytes > fold._max_bytes:
            fold._exceeded_bytes()
        elif len(parts) >= RUN_LENGTH:
            acc.compact()

    return on_delta


def _with_streamed_content(block: ContentBlock, acc: Acc | None) -> ContentBlock:
    """A by-reference block-end's block with its content taken from the deltas received.

    The block's other fields (id, name, signature) are its own; a block kind that never
    streams (tool result, image) has nothing to take and is kept as it is.
    """
    streamed = acc.text() if acc is not None else ""
    match block:
        case TextBlock():
            return TextBlock(streamed)
        case ReasoningBlock(signature=signature, redacted=redacted):
            return ReasoningBlock(streamed, signature, redacted)
        case ToolCallBlock(id=id_, name=name):
            return ToolCallBlock(id_, name, streamed)
        case ToolResultBlock() | ImageBlock():
            return block
        case _:
            assert_never(block)


def _built(acc: Acc) -> ContentBlock | None:
    """The block an open accumulation ends as at finish; None if only a block-end can end it."""
    match acc.kind:
        case "text":
            return TextBlock(acc.text())
        case "reasoning":
            return ReasoningBlock(acc.text())
        case "tool-call":
            return acc.tool_call()
        case "tool-result" | "image":
            return None
        case _:
            assert_never(acc.kind)


_ACCUMULATING: dict[type, _Handler] = {
    BlockStart: StepFold._on_start,
    TextDelta: _text_handler("text"),
    ReasoningDelta: _text_handler("reasoning"),
    ToolCallDelta: StepFold._on_tool_call,
    BlockEnd: StepFold._on_end,
    Usage: StepFold._on_usage,
    Finish: StepFold._on_finish,
}
_COUNTING: dict[type, _Handler] = {
    **_ACCUMULATING,
    TextDelta: _counting_handler("text"),
    ReasoningDelta: _counting_handler("reasoning"),
}
_FAILED: dict[type, _Handler] = {
    **dict.fromkeys(CHUNK_TYPES, StepFold._skip),
    Usage: StepFold._on_usage,
    Finish: StepFold._finish_failed,
}
_ENDED: dict[type, _Handler] = dict.fromkeys(CHUNK_TYPES, StepFold._after_end)


def fold(
    chunks: Iterable[StreamChunk], limits: FoldLimits = DEFAULT_LIMITS
) -> Message | RecordedError:
    """Fold a whole step's chunks (in ordinal order) into its message or recorded error.

    Chunks that end without a ``finish`` give ``RecordedError(kind="abandoned")``; a chunk
    after the ``finish`` raises :class:`ChunkAfterFinish`, as with :class:`StepFold`.

    >>> fold([TextDelta(index=0, text="hi"), Finish(reason="stop")]).content
    [TextBlock(text='hi')]
    """
    step = StepFold(limits)
    feed = step.feed
    for chunk in chunks:
        feed(chunk)
    if not step.finished:
        return step.fail("abandoned", "the chunks ended without a finish")
    return step.result()
