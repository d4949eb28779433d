"""SessionRenderer: a session's envelopes in stream order in, what the user saw out.

Each (turn, step) gets a :class:`~tokenwire.fold.StepCollector` (the one fold), which restores
ordinal order when a retried publish landed late. What a chunk shows is derived from the
chunks the collector actually fed to the fold, so a buffered chunk shows nothing until the
chunk that unblocks it arrives. Tool calls show only once complete: at their ``block-end``,
or at the step's finish for protocols that never send one.
"""

from __future__ import annotations

from collections import OrderedDict

from tokenwire.fold import (
    DEFAULT_LIMITS,
    Added,
    FoldLimits,
    InvalidOrdinal,
    ReorderWindowError,
    StepCollector,
)
from tokenwire.replay._events import (
    Shown,
    ShownError,
    ShownFinish,
    ShownReasoning,
    ShownStepStart,
    ShownText,
    ShownToolCall,
)
from tokenwire.schemas import (
    BlockEnd,
    ChunkEnvelope,
    Message,
    ReasoningBlock,
    ReasoningDelta,
    TextBlock,
    TextDelta,
    ToolCallBlock,
)

StepKey = tuple[int, int]
DEFAULT_MAX_OPEN_STEPS = 1024
DEFAULT_REMEMBER_DONE = 4096


class _StepView:
    """One open step: its collector, the envelopes it buffers, what it already showed."""

    __slots__ = ("collector", "held", "shown_calls", "streamed")

    def __init__(self, limits: FoldLimits) -> None:
        # The text was shown as it streamed: the fold counts it (same rules, same limits)
        # without keeping it, so a reader holds a long step's tool calls, not its text.
        self.collector = StepCollector(limits, keep_text=False)
        self.held: dict[int, ChunkEnvelope] = {}
        self.streamed: set[int] = set()
        self.shown_calls: set[str] = set()


class SessionRenderer:
    """Render one session's chunks, delivered in any order, as the user saw them.

    Bounded: at most ``max_open_steps`` unfinished steps are held (past it the oldest is
    forgotten: its later chunks render as a new step would); finished steps are remembered
    (``remember_done`` of them) so a late duplicate of theirs shows nothing.

    >>> from tokenwire.schemas import Finish
    >>> r = SessionRenderer()
    >>> env = ChunkEnvelope("s", 0, 0, 0, 1, "p", "m", TextDelta(index=0, text="hi"))
    >>> r.render(env)
    (ShownStepStart(time_to_first_chunk_s=None), ShownText(index=0, text='hi'))
    """

    __slots__ = ("_done", "_limits", "_max_open", "_open", "_remember")

    def __init__(
        self,
        *,
        limits: FoldLimits = DEFAULT_LIMITS,
        max_open_steps: int = DEFAULT_MAX_OPEN_STEPS,
        remember_done: int = DEFAULT_REMEMBER_DONE,
    ) -> None:
        self._limits = limits
        self._max_open = max_open_steps
        self._remember = remember_done
        self._open: OrderedDict[StepKey, _StepView] = OrderedDict()
        self._done: OrderedDict[StepKey, None] = OrderedDict()

    def render(self, envelope: ChunkEnvelope) -> tuple[Shown, ...]:
        """What this chunk showed (possibly nothing, possibly what it unblocked too)."""
        key = (envelope.turn, envelope.step)
        view = self._open.get(key)
        if view is None:
            if key in self._done:
                return ()
            view = self._start(key)
        collector = view.collector
        before = collector.next_ordinal
        ordinal = envelope.ordinal
        chunk = envelope.chunk
        if ordinal == before and not view.held and type(chunk) is TextDelta and ordinal:
            # The hot path: the next text fragment, in order, nothing waiting.
            collector.add(ordinal, chunk)
            if not chunk.text:
                return ()
            view.streamed.add(chunk.index)
            return (ShownText(chunk.index, chunk.text),)
        return self._slow(key, view, envelope)

    def unfinished(self) -> list[StepKey]:
        """The steps seen without their finish (so far), oldest first."""
        return list(self._open)

    def _slow(self, key: StepKey, view: _StepView, envelope: ChunkEnvelope) -> tuple[Shown, ...]:
        collector = view.collector
        before = collector.next_ordinal
        try:
            added = collector.add(envelope.ordinal, envelope.chunk)
        except InvalidOrdinal:
            return ()
        except ReorderWindowError as exc:
            error = collector.fail("gap", str(exc))
            self._close(key)
            return (ShownError(error),)
        if added is Added.BUFFERED:
            view.held[envelope.ordinal] = envelope
            return ()
        if added is not Added.ACCEPTED:
            return ()
        out: list[Shown] = []
        for ordinal in range(before, collector.next_ordinal):
            fed = envelope if ordinal == envelope.ordinal else view.held.pop(ordinal)
            _show(view, fed, out)
        if collector.fold.finished:
            _ending(view, out)
            self._close(key)
        return tuple(out)

    def _start(self, key: StepKey) -> _StepView:
        if len(self._open) >= self._max_open:
            self._open.popitem(last=False)
        view = self._open[key] = _StepView(self._limits)
        return view

    def _close(self, key: StepKey) -> None:
        del self._open[key]
        self._done[key] = None
        if len(self._done) > self._remember:
            self._done.popitem(last=False)


def _show(view: _StepView, envelope: ChunkEnvelope, out: list[Shown]) -> None:
    """Append what one chunk, just fed to the fold, showed."""
    chunk = envelope.chunk
    if envelope.ordinal == 0:
        out.append(ShownStepStart(_ttfc(envelope)))
    if type(chunk) is TextDelta or type(chunk) is ReasoningDelta:
        if chunk.text:
            view.streamed.add(chunk.index)
            shown_type = ShownText if type(chunk) is TextDelta else ShownReasoning
            out.append(shown_type(chunk.index, chunk.text))
    elif type(chunk) is BlockEnd:
        _show_block_end(view, chunk, out)


def _show_block_end(view: _StepView, chunk: BlockEnd, out: list[Shown]) -> None:
    block = chunk.block
    if chunk.by_reference:
        return  # its content streamed as deltas; a tool call is shown from the step's result
    if isinstance(block, ToolCallBlock):
        view.shown_calls.add(block.id)
        out.append(ShownToolCall(block))
    elif chunk.index in view.streamed or not getattr(block, "text", ""):
        return  # already shown as it streamed (or nothing to show)
    elif isinstance(block, TextBlock):
        out.append(ShownText(chunk.index, block.text))
    elif isinstance(block, ReasoningBlock):
        out.append(ShownReasoning(chunk.index, block.text))


def _ending(view: _StepView, out: list[Shown]) -> None:
    """Append the step's end: the calls not shown yet and the finish, or the error."""
    result = view.collector.result()
    if not isinstance(result, Message):
        out.append(ShownError(result))
        return
    for call in result.tool_calls:
        if call.id not in view.shown_calls:
            out.append(ShownToolCall(call))
    out.append(ShownFinish(result.finish_reason, result.usage, len(result.dropped_tool_calls)))


def _ttfc(envelope: ChunkEnvelope) -> float | None:
    if envelope.request_time_ns is None:
        return None
    return max(0, envelope.time_ns - envelope.request_time_ns) / 1e9
