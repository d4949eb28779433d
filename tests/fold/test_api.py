"""The public surface of tokenwire.fold: exports, docstring examples, the dispatch is complete."""

from __future__ import annotations

import doctest
from typing import get_args

import pytest

import tokenwire.fold
from tokenwire.fold import (
    ChunkAfterFinish,
    ContractViolation,
    FoldError,
    StepFold,
    _collector,
    _step,
)
from tokenwire.schemas import (
    BlockEnd,
    BlockStart,
    Finish,
    ReasoningDelta,
    StreamChunk,
    TextBlock,
    TextDelta,
    TokenUsage,
    ToolCallDelta,
    Usage,
)

ONE_OF_EACH: list[StreamChunk] = [
    BlockStart(index=0, block_type="text"),
    TextDelta(index=0, text="a"),
    BlockEnd(index=0, block=TextBlock("a")),
    ReasoningDelta(index=1, text="b"),
    ToolCallDelta(index=2, id="c", name="f", arguments_delta="{}"),
    Usage(TokenUsage(output_tokens=1)),
    Finish(reason="stop"),
]


def test_all_lists_exactly_the_public_names() -> None:
    public = {n for n in vars(tokenwire.fold) if not n.startswith("_")} - {"annotations"}
    assert sorted(tokenwire.fold.__all__) == sorted(public)


def test_every_stream_chunk_variant_is_handled() -> None:
    # The dict dispatch stands in for match + assert_never: a new StreamChunk variant must fail
    # here until the fold handles it.
    assert {type(c) for c in ONE_OF_EACH} == set(get_args(StreamChunk))
    step = StepFold()
    for chunk in ONE_OF_EACH:
        step.feed(chunk)
    for chunk in ONE_OF_EACH:
        with pytest.raises(ChunkAfterFinish):
            step.feed(chunk)


def test_the_exception_tree() -> None:
    assert issubclass(ChunkAfterFinish, ContractViolation)
    for name in ("ContractViolation", "InvalidOrdinal", "ReorderWindowError", "StepStateError"):
        assert issubclass(getattr(tokenwire.fold, name), FoldError)


@pytest.mark.parametrize("module", [_step, _collector])
def test_docstring_examples(module) -> None:
    failed, attempted = doctest.testmod(module)
    assert attempted > 0
    assert failed == 0


def test_the_fold_imports_only_the_schemas_and_the_standard_library() -> None:
    import ast
    import sys
    from pathlib import Path

    allowed = {"tokenwire.fold", "tokenwire.schemas"}
    for path in Path(tokenwire.fold.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                inside = any(name == a or name.startswith(a + ".") for a in allowed)
                assert inside or top in sys.stdlib_module_names or top == "__future__", (
                    f"{path.name} imports {name}"
                )
