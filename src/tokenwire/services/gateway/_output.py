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
from tokenwire.services.gateway._encode_responses import (
    ResponsesStreamEncoder,
    responses_error_event,
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
        self._responses = dialect == "openai-responses"
        self._strip_usage = strip_usage and self._openai
        self._tap: _Tap | None = None
        self._error_sent = False
        self._held: list[SseEvent] = []  # Responses: the terminal event, until the acks
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
        if self._responses:
            return self._drain() + b"".join(frame(e) for e in self._held)
        return self._drain() + (DONE if self._openai else MESSAGE_STOP)

    def failure(self, message: str) -> bytes:
        self._error_sent = True
        if self._responses:
            return responses_error_event(message, "server_error", 0)
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
        if self._responses:
            return self._forwarded_responses(event)
        if event.event == "error":
            self._error_sent = True
        if event.event == "message_stop":
            self._ended = True
            return False
        return True

    def _forwarded_responses(self, event: SseEvent) -> bool:
        if event.event in ("response.completed", "response.incomplete"):
            self._held.append(event)
            return False
        if event.event in ("error", "response.failed"):
            self._error_sent = True
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

    def __init__(
        self, encoder: OpenAIStreamEncoder | AnthropicStreamEncoder | ResponsesStreamEncoder
    ) -> None:
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
        if isinstance(self._encoder, ResponsesStreamEncoder):
            return self._encoder.end()
        return DONE if self._openai else MESSAGE_STOP

    def failure(self, message: str) -> bytes:
        if isinstance(self._encoder, ResponsesStreamEncoder):
            return self._encoder.failure(message)
        if self._openai:
            return openai_stream_error(message, "api_error")
        return anthropic_stream_error(message, "api_error")


class _Head(msgspec.Struct):
    id: str | None = None
    model: str | None = None


class _Opening(msgspec.Struct):
    """Where each dialect names its response: Chat chunks at the top, Anthropic in
    ``message_start.message``, Responses in ``response``, Gemini as ``responseId`` /
    ``modelVersion``."""

    id: str | None = None
    model: str | None = None
    message: _Head | None = None
    response: _Head | None = None
    responseId: str | None = None  # noqa: N815 (Gemini's name)
    modelVersion: str | None = None  # noqa: N815

    def head(self) -> tuple[str | None, str | None]:
        for inner in (self.message, self.response):
            if inner is not None and (inner.id or inner.model):
                return inner.id, inner.model
        return self.id or self.responseId, self.model or self.modelVersion


_opening = msgspec.json.Decoder(_Opening)
_SNIFFED_EVENTS = 4
"""Events read for the provider's response id and model (they come in the first one)."""


class _HeadTap:
    """A normaliser that also reads the provider's own response id and model."""

    def __init__(self, inner: Normaliser) -> None:
        self._inner = inner
        self.response_id: str | None = None
        self.model: str | None = None
        self._left = _SNIFFED_EVENTS

    def feed(self, event: SseEvent) -> list[StreamChunk]:
        if self._left > 0:
            self._left -= 1
            self._sniff(event.data)
        return self._inner.feed(event)

    def close(self) -> list[StreamChunk]:
        return self._inner.close()

    def _sniff(self, data: str) -> None:
        try:
            response_id, model = _opening.decode(data).head()
        except msgspec.DecodeError:
            return
        self.response_id = self.response_id or response_id
        self.model = self.model or model
        if self.response_id and self.model:
            self._left = 0


class FoldingOutput:
    """Non-streaming callers: nothing is sent while the step runs; the fold is the answer.

    ``provider_id`` and ``provider_model`` are the provider's own names for the answer, read
    from its first events (``None`` when it sent none).
    """

    def __init__(self) -> None:
        self._fold = StepFold()
        self._tap: _HeadTap | None = None

    def normaliser(self, inner: Normaliser) -> Normaliser:
        self._tap = _HeadTap(inner)
        return self._tap

    @property
    def provider_id(self) -> str | None:
        return self._tap.response_id if self._tap is not None else None

    @property
    def provider_model(self) -> str | None:
        return self._tap.model if self._tap is not None else None

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
