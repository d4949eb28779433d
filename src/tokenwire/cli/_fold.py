"""``tokenwire fold``: chunks (or a provider's recorded SSE body) in, the assembled step out."""

from __future__ import annotations

import sys
from typing import BinaryIO

import click
import msgspec

from tokenwire.cli._errors import CheckFailedError, UsageError
from tokenwire.schemas import RecordedError, StreamChunk, chunk_decoder, json_encoder


@click.command()
@click.argument("source", default="-", type=click.File("rb"))
@click.option(
    "--provider",
    default="tokenwire",
    show_default=True,
    help="Input format: 'tokenwire' (StreamChunk JSONL) or a provider name (SSE body).",
)
@click.option("--chunks", is_flag=True, help="Print the normalised chunks (JSONL), not the fold.")
def fold(source: BinaryIO, provider: str, chunks: bool) -> None:
    """Fold a stream: tokenwire chunk JSONL or a recorded provider SSE body (FILE or -).

    Prints the message, or the recorded error marked ``"type": "error"`` and exits 1.
    """
    parsed = list(_read(source, provider))
    if chunks:
        for chunk in parsed:
            sys.stdout.buffer.write(json_encoder.encode(chunk) + b"\n")
        return
    from tokenwire.fold import fold as fold_chunks

    result = fold_chunks(parsed)
    if isinstance(result, RecordedError):
        marked = {"type": "error", **msgspec.to_builtins(result)}
        sys.stdout.buffer.write(msgspec.json.format(json_encoder.encode(marked)) + b"\n")
        raise CheckFailedError(f"the stream folds to a recorded error ({result.kind})")
    sys.stdout.buffer.write(msgspec.json.format(json_encoder.encode(result)) + b"\n")


def _read(source: BinaryIO, provider: str) -> list[StreamChunk]:
    if provider == "tokenwire":
        return _read_jsonl(source)
    from tokenwire.providers import normalise_body

    return normalise_body(provider, source.read())


def _read_jsonl(source: BinaryIO) -> list[StreamChunk]:
    out: list[StreamChunk] = []
    for number, line in enumerate(source, start=1):
        if not line.strip():
            continue
        try:
            out.append(chunk_decoder.decode(line))
        except msgspec.DecodeError as exc:
            raise UsageError(f"line {number}: not a tokenwire chunk: {exc}") from exc
    return out
