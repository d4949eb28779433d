"""From rendered frames to the actions the player performs: send, stall, abort."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec

from tokenwire.services.scripted_provider._script import Script


class Frame(msgspec.Struct, frozen=True):
    """One SSE event as bytes; ``fragment`` when it carries a fragment of content."""

    data: bytes
    fragment: bool = False


class Emit(msgspec.Struct, frozen=True, tag=True):
    """Send ``data``; ``paced`` sends wait their turn under ``token_rate``."""

    data: bytes
    paced: bool = False


class Stall(msgspec.Struct, frozen=True, tag=True):
    """Send nothing for ``seconds`` (cut short when the server shuts down)."""

    seconds: float


class Abort(msgspec.Struct, frozen=True, tag=True):
    """Close the connection without finishing the response body."""


Action = Emit | Stall | Abort
"""What the player does next; the body ends cleanly after the last action unless it aborts."""


def plan_stream(script: Script, frames: list[Frame], error_frame: bytes | None) -> Iterator[Action]:
    """The actions streaming ``frames`` (the complete stream) the way ``script.ending`` says.

    ``error``, ``drop`` and ``truncate`` stop right after the last fragment, then send
    ``error_frame``, abort the connection, or end the body, respectively.
    """
    cut = script.ending in ("error", "drop", "truncate")
    last = max((i for i, f in enumerate(frames) if f.fragment), default=len(frames) - 1)
    sent = 0
    for frame in frames[: last + 1] if cut else frames:
        yield Emit(frame.data, paced=frame.fragment)
        sent += frame.fragment
        if frame.fragment and sent == script.stall_after:
            yield Stall(script.stall_s)
    if script.ending == "error" and error_frame is not None:
        yield Emit(error_frame)
    elif script.ending == "drop":
        yield Abort()


def plan_body(script: Script, body: bytes) -> Iterator[Action]:
    """The actions sending a non-streaming ``body``: stalls before it, or cuts it in half."""
    if script.stall_after is not None:
        yield Stall(script.stall_s)
    if script.ending in ("drop", "truncate"):
        yield Emit(body[: len(body) // 2])
        if script.ending == "drop":
            yield Abort()
        return
    yield Emit(body)
