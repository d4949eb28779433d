"""What the caller receives while a step runs: forwarded provider events, encoded chunks, or
nothing (non-streaming callers get the folded result at the end).

Every output holds back the dialect's terminator (``data: [DONE]``, ``message_stop``) until the
step's chunks are acknowledged by the broker, so a caller never sees a completed stream for a
step that was not captured; :meth:`CallerOutput.failure` ends the stream with the dialect's
error form instead.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import msgspec

from tokenwire.fold import FoldError, StepFold
from tokenwire.providers import Normaliser
from tokenwire.schemas import Finish, Message, RecordedError, StreamChunk
from tokenwire.services.gateway._encode_anthropic import (
    MESSAGE_STOP,
    AnthropicStreamEncoder,
    anthropic_stream_error,
)
from tokenwire.services.gateway._encode_openai import (
    DONE,
    OpenAIStreamEncoder,
    openai_stream_error,
)
from tokenwire.sse import SseEvent


class CallerOutput(Protocol):
    """Turns a step's progress into the bytes its caller receives."""

    def normaliser(self, inner: Normaliser) -> Normaliser:
        """The normaliser to read the provider with (a tap for forwarding)."""
        ...

    def opening(self) -> bytes:
        """Sent once the provider answered (before the first chunk's bytes)."""
        ...

    def chunk(self, chunk: StreamChunk) -> bytes:
        """Sent for each chunk, in order."""
        ...

    def idle(self) -> bytes:
        """Sent after a provider read that brought no chunk (what it forwards is not kept)."""
        ...

    def ending(self) -> bytes:
        """Sent after a normal finish once every chunk is acknowledged."""
        ...

    def failure(self, message: str) -> bytes:
        """Sent when the step fails after the caller's stream began."""
        ...


TAP_MAX_IDLE_BYTES = 64 * 1024
"""Events that produced no chunk kept (for forwarding) before the first chunk, at most;
later ones are not kept until a chunk comes. After the first chunk a read without a chunk
forwards what it read at once (``idle``), so nothing piles up either way."""


class _Tap:
    """A normaliser that also keeps the events it reads, for forwarding them unchanged."""

    def __init__(self, inner: Normaliser) -> None:
        self._inner = inner
        self.events: list[SseEvent] = []
        self._idle_bytes = 0  # data of kept events that produced no chunk yet

    def feed(self, event: SseEvent) -> list[StreamChunk]:
        chunks = self._inner.feed(event)
        if chunks:
            self._idle_bytes = 0
        elif self._idle_bytes + len(event.data) > TAP_MAX_IDLE_BYTES:
            return chunks  # carries nothing and the bound is reached: not kept
        else:
            self._idle_bytes += len(event.data)
        self.events.append(event)
        return chunks

    def close(self) -> list[StreamChunk]:
        return self._inner.close()

    def take(self) -> list[SseEvent]:
        """The kept events, in order; none are kept after."""
        events, self.events, self._idle_bytes = self.events, [], 0
        return events


class _Probe(msgspec.Struct):
    choices: list[Any] | None = None
    usage: dict[str, Any] | None = None
    error: Any = None


_probe = msgspec.json.Decoder(_Probe)


def frame(event: SseEvent) -> bytes:
    """One event in SSE framing (``event:`` only when named, one ``data:`` line per line)."""
    if event.event == "message" and "\n" not in event.data:
        return b"data: " + event.data.encode() + b"\n\n"  # the usual event: one data line
    head = b"" if event.event == "message" else b"event: " + event.event.encode() + b"\n"
    lines = b"".join(b"data: " + line.encode() + b"\n" for line in event.data.split("\n"))
    return head + lines + b"\n"


class ForwardingOutput:
    """Same dialect: the provider's events go to the caller as they are read.

    Only two changes: the dialect terminator is held until the acks (see module docstring), and
    for an OpenAI caller that did not ask for usage, the extra usage chunk the gateway asked
    for is left out.
    """

    def __init__(self, dialect: str, *, strip_usage: bool) -> None:
        self._openai = dialect == "openai-chat"
        self._strip_usage = strip_usage and self._openai
        self._tap: _Tap | None = None
        self._error_sent = False
        self._ended = False

    def normaliser(self, inner: Normaliser) -> Normaliser:
        self._tap = _Tap(inner)
        return self._tap

    def opening(self) -> bytes:
        return b""

    def chunk(self, chunk: StreamChunk) -> bytes:
        out = self._drain()
        failed = isinstance(chunk, Finish) and chunk.reason in ("error", "aborted")
        if isinstance(chunk, Finish) and failed and not self._error_sent:
            out += self.failure(_reason(chunk))  # the provider's stream just stopped
        return out

    def idle(self) -> bytes:
        return self._drain()

    def ending(self) -> bytes:
        return self._drain() + (DONE if self._openai else MESSAGE_STOP)

    def failure(self, message: str) -> bytes:
        self._error_sent = True
        return (
            openai_stream_error(message, "api_error")
            if self._openai
            else (anthropic_stream_error(message, "api_error"))
        )

    def _drain(self) -> bytes:
        if self._tap is None or not self._tap.events:
            return b""
        return b"".join(frame(e) for e in self._tap.take() if self._forwarded(e))

    def _forwarded(self, event: SseEvent) -> bool:
        """Whether the event goes to the caller: nothing after the provider's end event
        (``[DONE]``, ``message_stop``), which the step does not read past either."""
        if self._ended:
            return False
        if self._openai:
            return self._forwarded_openai(event)
        if event.event == "error":
            self._error_sent = True
        if event.event == "message_stop":
            self._ended = True
            return False
        return True

    def _forwarded_openai(self, event: SseEvent) -> bool:
        data = event.data
        if data.startswith("[DONE]"):
            self._ended = True
            return False
        if '"error"' in data or (self._strip_usage and _may_be_usage_only(data)):
            try:
                probe = _probe.decode(data)
            except msgspec.DecodeError:
                return True
            if probe.error is not None:
                self._error_sent = True
            return not (self._strip_usage and probe.usage is not None and not probe.choices)
        return True


def _may_be_usage_only(data: str) -> bool:
    """Whether an OpenAI event may be the usage-only chunk (so it must be decoded to tell).

    With ``include_usage`` OpenAI-compatible servers put ``"usage":null`` on every other
    chunk: those are recognised by that text, without decoding each event (a quote inside a
    JSON string is escaped, so the text can only be the structure).
    """
    return '"usage"' in data and '"usage":null' not in data


def _reason(finish: Finish) -> str:
    return finish.error.message if finish.error is not None else "the step was aborted"


class EncodingOutput:
    """Another dialect: chunks encoded into the caller's dialect by a stream encoder."""

    def __init__(self, encoder: OpenAIStreamEncoder | AnthropicStreamEncoder) -> None:
        self._encoder = encoder
        self._openai = isinstance(encoder, OpenAIStreamEncoder)

    def normaliser(self, inner: Normaliser) -> Normaliser:
        return inner

    def opening(self) -> bytes:
        return self._encoder.start()

    def chunk(self, chunk: StreamChunk) -> bytes:
        return self._encoder.encode(chunk)

    def idle(self) -> bytes:
        return b""

    def ending(self) -> bytes:
        return DONE if self._openai else MESSAGE_STOP

    def failure(self, message: str) -> bytes:
        if self._openai:
            return openai_stream_error(message, "api_error")
        return anthropic_stream_error(message, "api_error")


class FoldingOutput:
    """Non-streaming callers: nothing is sent while the step runs; the fold is the answer."""

    def __init__(self) -> None:
        self._fold = StepFold()

    def normaliser(self, inner: Normaliser) -> Normaliser:
        return inner

    def opening(self) -> bytes:
        return b""

    def chunk(self, chunk: StreamChunk) -> bytes:
        # A chunk after finish: the fold already has its answer; the broker has every chunk.
        with contextlib.suppress(FoldError):
            self._fold.feed(chunk)
        return b""

    def idle(self) -> bytes:
        return b""

    def ending(self) -> bytes:
        return b""

    def failure(self, message: str) -> bytes:
        return b""

    def result(self) -> Message | RecordedError:
        """The folded message or recorded error of the step."""
        return self._fold.result()
