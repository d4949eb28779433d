"""Hypothesis strategies for the fold's property tests: planned blocks and the chunks of them.

A plan is the oracle: the original blocks, and how an adapter could have streamed them
(fragments cut at arbitrary points, optional block-start/block-end, interleaved across
indexes, fragment order within a block kept). Expected values come from the plan, never
from the fold.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field

from hypothesis import strategies as st

from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    BlockType,
    ContentBlock,
    ImageBlock,
    ReasoningBlock,
    ReasoningDelta,
    StreamChunk,
    TextBlock,
    TextDelta,
    ToolCallBlock,
    ToolCallDelta,
    ToolResultBlock,
)

BLOCK_TAG = {
    TextBlock: "text",
    ReasoningBlock: "reasoning",
    ToolCallBlock: "tool-call",
    ToolResultBlock: "tool-result",
    ImageBlock: "image",
}


@dataclass
class PlannedBlock:
    """One original block and the chunks that stream it, in their within-block order."""

    index: int
    block: ContentBlock
    chunks: list[StreamChunk]
    fragments: list[str] = field(default_factory=list)  # text or arguments pieces, in order


@dataclass
class Plan:
    blocks: list[PlannedBlock]
    chunks: list[StreamChunk]  # interleaved, without usage/finish

    def expected_content(self, *, drop_tool_calls: bool = False) -> list[ContentBlock]:
        ordered = sorted(self.blocks, key=lambda p: p.index)
        return [
            p.block for p in ordered if not (drop_tool_calls and isinstance(p.block, ToolCallBlock))
        ]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
texts = st.text(max_size=30)  # unicode, surrogates excluded by hypothesis' default alphabet


@st.composite
def split(draw: st.DrawFn, s: str) -> list[str]:
    """``s`` cut at arbitrary points (repeated cuts give empty fragments, which must not matter)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(s)), max_size=6)))
    bounds = [0, *cuts, len(s)]
    return [s[a:b] for a, b in itertools.pairwise(bounds)]


@st.composite
def planned_block(draw: st.DrawFn, index: int, truncate: bool = False) -> PlannedBlock:
    """One block at ``index``; with ``truncate`` a tool call may stop after any fragment
    (no block-end then), as when ``max-tokens`` cuts it: its block is what was received."""
    kind: BlockType = draw(
        st.sampled_from(["text", "reasoning", "tool-call", "tool-result", "image"])
    )
    start = draw(st.booleans())
    end = kind in ("tool-result", "image") or draw(st.booleans())
    head: list[StreamChunk] = [BlockStart(index=index, block_type=kind)] if start else []
    if kind in ("tool-result", "image"):
        block: ContentBlock = (
            ToolResultBlock(tool_call_id=f"call_{index}", content=draw(texts))
            if kind == "tool-result"
            else ImageBlock(media_type="image/png", url=f"https://example.com/{index}.png")
        )
        return PlannedBlock(index, block, [*head, BlockEnd(index=index, block=block)])
    if kind == "tool-call":
        return _tool_call(draw, index, head, end, truncate)
    return _text_like(draw, index, kind, head, end)


def _text_like(
    draw: st.DrawFn, index: int, kind: str, head: list[StreamChunk], end: bool
) -> PlannedBlock:
    # Without a block-start or block-end, only a non-empty delta can make the block exist.
    text = draw(texts if (head or end) else st.text(min_size=1, max_size=30))
    if kind == "text":
        block: TextBlock | ReasoningBlock = TextBlock(text)
        delta: type[TextDelta] | type[ReasoningDelta] = TextDelta
    else:
        signed = end and draw(st.booleans())  # a signature only arrives on block-end
        redacted = signed and draw(st.booleans())
        block = ReasoningBlock(
            "" if redacted else text,
            signature=draw(st.text(min_size=1, max_size=8)) if signed else None,
            redacted="b64-opaque" if redacted else None,
        )
        delta = ReasoningDelta
    fragments = draw(split(block.text))
    chunks = [*head, *(delta(index=index, text=f) for f in fragments)]
    if end:
        chunks.append(BlockEnd(index=index, block=block))
    return PlannedBlock(index, block, chunks, fragments)


def _tool_call(
    draw: st.DrawFn, index: int, head: list[StreamChunk], end: bool, truncate: bool
) -> PlannedBlock:
    call_id = f"call_{index}"
    name = draw(st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True))
    arguments = json.dumps(draw(json_values), ensure_ascii=draw(st.booleans()))
    fragments = draw(split(arguments))
    if truncate and draw(st.booleans()):
        fragments = fragments[: draw(st.integers(1, len(fragments)))]
        arguments, end = "".join(fragments), False
    id_on_all = draw(st.booleans())  # OpenAI sends the id on the first fragment only
    chunks = [
        *head,
        *(
            ToolCallDelta(
                index=index,
                id=call_id if (i == 0 or id_on_all) else "",
                name=name if i == 0 else None,
                arguments_delta=f,
            )
            for i, f in enumerate(fragments)
        ),
    ]
    block = ToolCallBlock(id=call_id, name=name, arguments=arguments)
    if end:
        chunks.append(BlockEnd(index=index, block=block))
    return PlannedBlock(index, block, chunks, fragments)


@st.composite
def interleave(draw: st.DrawFn, sequences: list[list[StreamChunk]]) -> list[StreamChunk]:
    """One arbitrary interleaving of the sequences, each kept in its own order."""
    owners = draw(st.permutations([i for i, seq in enumerate(sequences) for _ in seq]))
    positions = [0] * len(sequences)
    out: list[StreamChunk] = []
    for owner in owners:
        out.append(sequences[owner][positions[owner]])
        positions[owner] += 1
    return out


@st.composite
def plans(draw: st.DrawFn, max_blocks: int = 5, truncate: bool = False) -> Plan:
    indexes = draw(st.lists(st.integers(0, 40), unique=True, max_size=max_blocks))
    blocks = [draw(planned_block(i, truncate)) for i in indexes]
    chunks = draw(interleave([b.chunks for b in blocks]))
    return Plan(blocks, chunks)
