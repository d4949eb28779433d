"""What the caller receives, in the order bytes flow: the step's output
(:class:`CallerOutput`: forwarded provider events, encoded chunks, or the folded answer at the
end), the bounded :class:`Outbox` between the step and the caller's response, and that
response (:class:`StepStream`). Every output holds back the dialect's terminator until the
broker acknowledged the step's chunks, so a caller never sees a completed stream for a step
that was not captured. The step (``_steps/step.py``) owns all three for its caller.
docs/gateway.md, "Publishing semantics" and "Performance".
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import msgspec
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from tokenwire.fold import FoldError, StepFold
from tokenwire.providers import Normaliser
from tokenwire.schemas import Finish, Message, RecordedError, StreamChunk
from tokenwire.services.gateway._dialects import (
    CallerCodec,
    Forwarder,
    R,
    Reply,
    StreamEncoder,
    frame,
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
        """Sent for each chunk once it is published, in order."""
        ...

    def flush(self) -> bytes:
        """Sent after the chunks of one provider read (all published, or the step stopped
        among them): what the published chunks still owe the caller."""
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
    """A normaliser that also keeps the events it reads, for forwarding them unchanged.

    Each kept event remembers how many chunks the stream had produced once it was fed, so it
    is released to the caller only when all of them were published: an event the caller sees
    never carries content the log lacks, even when a bound stops the step in the middle of a
    read (issue 12, part 4). Two parallel lists, not a list of pairs: one allocation fewer per
    event on the gateway's hottest path.
    """

    def __init__(self, inner: Normaliser) -> None:
        self._inner = inner
        self.events: list[SseEvent] = []
        self._counts: list[int] = []  # chunks produced once each kept event was fed
        self._produced = 0  # chunks the inner normaliser made so far
        self._idle_bytes = 0  # data of kept events that produced no chunk yet
        self._finished = False

    def feed(self, event: SseEvent) -> list[StreamChunk]:
        chunks = self._inner.feed(event)
        if self._finished:
            return chunks  # after the finish: never sent
        if chunks:
            self._idle_bytes = 0
            self._produced += len(chunks)
        elif self._idle_bytes + len(event.data) > TAP_MAX_IDLE_BYTES:
            return chunks  # carries nothing and the bound is reached: not kept
        else:
            self._idle_bytes += len(event.data)
        self.events.append(event)
        self._counts.append(self._produced)
        return chunks

    def close(self) -> list[StreamChunk]:
        chunks = self._inner.close()
        self._produced += len(chunks)
        return chunks

    def take(self, published: int) -> list[SseEvent]:
        """The kept events, in order, whose chunks are among the first ``published``."""
        counts = self._counts
        if not counts or counts[-1] <= published:  # the usual case: the whole read
            events, self.events, self._counts, self._idle_bytes = self.events, [], [], 0
            return events
        cut = bisect.bisect_right(counts, published)  # counts never decrease
        events = self.events[:cut]
        del self.events[:cut], counts[:cut]
        return events

    def discard(self) -> None:
        """Keep nothing more (the step's finish was published: nothing after it is sent)."""
        self.events, self._counts, self._idle_bytes = [], [], 0
        self._finished = True


class ForwardingOutput:
    """Same dialect: the provider's events go to the caller as their chunks are published.

    Only two changes, the dialect's :class:`Forwarder` decides which: the dialect terminator is
    held until the acks (see module docstring), and for an OpenAI caller that did not ask for
    usage, the extra usage chunk the gateway asked for is left out. An event is sent once
    every chunk it produced was published (see :class:`_Tap`), at the read's :meth:`flush`;
    nothing after the finish.
    """

    def __init__(self, forwarder: Forwarder) -> None:
        self._forwarder = forwarder
        self._tap: _Tap | None = None
        self._published = 0

    def normaliser(self, inner: Normaliser) -> Normaliser:
        self._tap = _Tap(inner)
        return self._tap

    def opening(self) -> bytes:
        return b""

    def chunk(self, chunk: StreamChunk) -> bytes:
        self._published += 1
        if type(chunk) is not Finish:
            return b""  # its events go at the read's flush
        out = self._drain()
        if self._tap is not None:
            self._tap.discard()
        if chunk.reason in ("error", "aborted") and not self._forwarder.error_sent:
            out += self.failure(_reason(chunk))  # the provider's stream just stopped
        return out

    def flush(self) -> bytes:
        return self._drain()

    def idle(self) -> bytes:
        return self._drain()

    def ending(self) -> bytes:
        return self._drain() + self._forwarder.end()

    def failure(self, message: str) -> bytes:
        self._forwarder.error_sent = True
        return self._forwarder.failure(message)

    def _drain(self) -> bytes:
        if self._tap is None or not self._tap.events:
            return b""
        forwarded = self._forwarder.forwarded
        events = self._tap.take(self._published)
        if len(events) == 1:  # a paced stream's usual read: no list to build and join
            return frame(events[0]) if forwarded(events[0]) else b""
        return b"".join([frame(e) for e in events if forwarded(e)])


def _reason(finish: Finish) -> str:
    return finish.error.message if finish.error is not None else "the step was aborted"


class EncodingOutput:
    """Another dialect: chunks encoded into the caller's dialect by its stream encoder."""

    def __init__(self, encoder: StreamEncoder) -> None:
        self._encoder = encoder

    def normaliser(self, inner: Normaliser) -> Normaliser:
        return inner

    def opening(self) -> bytes:
        return self._encoder.start()

    def chunk(self, chunk: StreamChunk) -> bytes:
        return self._encoder.encode(chunk)

    def flush(self) -> bytes:
        return b""

    def idle(self) -> bytes:
        return b""

    def ending(self) -> bytes:
        return self._encoder.end()

    def failure(self, message: str) -> bytes:
        return self._encoder.failure(message)


class _Head(msgspec.Struct):
    id: str | None = None
    model: str | None = None
    created_at: object = None  # typed loosely: an odd value must not lose the id beside it


class _Opening(msgspec.Struct):
    """Where each dialect names its response: Chat chunks at the top, Anthropic in
    ``message_start.message``, Responses in ``response``, Gemini as ``responseId`` /
    ``modelVersion``."""

    id: str | None = None
    model: str | None = None
    created: object = None  # typed loosely, as _Head.created_at
    system_fingerprint: object = None  # typed loosely, as _Head.created_at
    message: _Head | None = None
    response: _Head | None = None
    responseId: str | None = None  # noqa: N815 (Gemini's name)
    modelVersion: str | None = None  # noqa: N815 (Gemini's name)

    def head(self) -> tuple[str | None, str | None]:
        for inner in (self.message, self.response):
            if inner is not None and (inner.id or inner.model):
                return inner.id, inner.model
        return self.id or self.responseId, self.model or self.modelVersion

    def created_at(self) -> int | None:
        """When the provider says it made the answer (Chat's ``created``, Responses'
        ``response.created_at``; Anthropic and Gemini send none)."""
        value = self.response.created_at if self.response is not None else self.created
        return value if type(value) is int else None


_opening = msgspec.json.Decoder(_Opening)
_SNIFFED_EVENTS = 4
"""Events read for the provider's response id and model (they come in the first one)."""


class HeadTap:
    """A normaliser that also reads the provider's own response id and model."""

    def __init__(self, inner: Normaliser) -> None:
        self._inner = inner
        self.response_id: str | None = None
        self.model: str | None = None
        self.created: int | None = None
        self.system_fingerprint: str | None = None
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
            opening = _opening.decode(data)
        except msgspec.DecodeError:
            return
        response_id, model = opening.head()
        self.response_id = self.response_id or response_id
        self.model = self.model or model
        self.created = self.created if self.created is not None else opening.created_at()
        if isinstance(opening.system_fingerprint, str):
            self.system_fingerprint = self.system_fingerprint or opening.system_fingerprint
        if self.response_id and self.model:
            self._left = 0


class FoldingOutput:
    """Non-streaming callers: nothing is sent while the step runs; the fold is the answer.

    ``provider_id`` and ``provider_model`` are the provider's own names for the answer, read
    from its first events (``None`` when it sent none).
    """

    def __init__(self) -> None:
        self._fold = StepFold()
        self._tap: HeadTap | None = None

    def normaliser(self, inner: Normaliser) -> Normaliser:
        self._tap = HeadTap(inner)
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

    def flush(self) -> bytes:
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


Writer = Callable[[bytes, bool], Awaitable[None]]
"""Writes bytes to the caller; the flag says they end the response's body (nothing follows)."""
BODY_NOW = "tokenwire.body_now"
"""The scope extension (``scope["extensions"][BODY_NOW]["write"]``) holding the server's
:data:`WriteNow` for the request: the gateway's own uvicorn protocol offers it
(``_api/edge.py``); under any other server it is absent and the body goes as ASGI messages."""
WriteNow = Callable[[bytes], bool]
"""Writes a piece of the body at once when the server can take it without waiting (True), or
nothing (False): the server's ``BODY_NOW`` extension (``_api/edge.py``)."""


class Outbox:
    """A single-producer, single-consumer byte buffer with back-pressure.

    The step appends; the response takes everything buffered at once, so writes coalesce
    while the caller is busy. Once the response has started it attaches its writer, and data
    that finds nothing buffered and no write in progress is written by the step itself: one
    task step per provider read fewer (most reads bring one event, and each task step waits
    behind every other ready callback; docs/gateway.md, "Performance"); with the server's
    :data:`WriteNow` attached too, :meth:`put_now` writes it without a coroutine at all.

    Bounds: when more than ``limit`` bytes wait, the step waits too (a slow caller slows the
    provider read, as if it had called the provider directly); a write the step makes itself
    waits in the server's flow control when the caller's socket is full (so the step may wait
    with less than ``limit`` held). Before the response has started nothing waits for room:
    the first read's bytes are taken whatever their size (bounded by the provider client's
    read buffer), since only the task putting them would start the response. When the caller
    leaves, :meth:`detach` drops the buffer and every later write, so the step reads on at
    full speed and the durable log stays complete; a writer that raises (a server reporting a
    gone caller so, as the ASGI spec allows) counts as the caller leaving, through
    ``on_error``.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._buffer = bytearray()
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._closed = False
        self._detached = False
        self._writer: Writer | None = None
        self._now: WriteNow | None = None
        self._on_error: Callable[[], None] = lambda: None
        self._writing = False

    @property
    def detached(self) -> bool:
        """Whether the caller is gone."""
        return self._detached

    def attach(
        self, writer: Writer, on_error: Callable[[], None], now: WriteNow | None = None
    ) -> None:
        """The response has started: ``put`` may write through ``writer`` itself (through
        ``now`` first, when the server offers it); ``on_error`` runs (after the outbox is
        detached) if either raises."""
        self._writer = writer
        self._now = now
        self._on_error = on_error

    def put_now(self, data: bytes) -> bool:
        """:meth:`put` when it need not wait: True once ``data`` is written (or dropped: the
        caller left, or nothing to write); False, nothing done, when it must go through
        :meth:`put` (something buffered or being written, no :data:`WriteNow`, or the server
        cannot take it at once)."""
        if self._detached or not data:
            return True
        if self._now is None or self._writing or self._buffer:
            return False
        try:
            return self._now(data)
        except Exception:
            self.detach()
            self._on_error()
            return True

    async def put(self, data: bytes) -> None:
        """Append ``data`` (or write it, see the module docstring); waits while more than
        ``limit`` bytes wait for the caller."""
        if self._detached or not data:
            return
        if self._writer is not None and not self._writing and not self._buffer:
            await self.write(data)
            return
        self._buffer += data
        self._ready.set()
        if len(self._buffer) > self._limit and self._writer is not None:
            self._room.clear()
            await self._room.wait()

    def close(self) -> None:
        """No more data: :meth:`get` returns ``None`` once the buffer is drained."""
        self._closed = True
        self._ready.set()

    def end(self, data: bytes) -> None:
        """The last bytes, then :meth:`close`: never written by the producer itself, so the
        response sends them with the end of its body in one write (:attr:`ended`). Waits for
        no room: nothing is read from the provider after them."""
        if not self._detached and data:
            self._buffer += data
        self.close()

    @property
    def ended(self) -> bool:
        """Closed with nothing left: the bytes :meth:`get` returned last are the last."""
        return self._closed and not self._buffer

    def detach(self) -> None:
        """The caller left: drop what waits and release a waiting producer and reader."""
        self._detached = True
        self._buffer.clear()
        self._room.set()
        self._ready.set()

    async def write(self, data: bytes, last: bool = False) -> None:
        """Write ``data`` through the attached writer, marked as the write in progress;
        ``last``: they end the body."""
        assert self._writer is not None  # attached
        self._writing = True
        try:
            await self._writer(data, last)
        except asyncio.CancelledError:
            if not self._detached:  # not written: the reader sends it, before the end
                self._buffer[:0] = data
            raise
        except Exception:
            self.detach()
            self._on_error()
        finally:
            self._writing = False
            if self._buffer:
                self._ready.set()

    async def get(self) -> bytes | None:
        """Everything buffered (waiting for some), or ``None`` at the end or once detached."""
        while not self._buffer or self._writing:
            if (self._closed and not self._buffer) or self._detached:
                return None
            self._ready.clear()
            await self._ready.wait()
        data = bytes(self._buffer)
        self._buffer.clear()
        self._room.set()
        return data


class StepStream(Response):
    """The response headers, then everything the outbox holds, one write per ``get``; the
    bytes the outbox ended with go out with the end of the chunked body, in one write (the
    dialect's terminator and the body's last chunk: one socket write, one read for the caller,
    per step).

    Starlette's ``StreamingResponse`` runs each response in an anyio task group of two tasks
    to notice a caller that left; that cost ~0.3 ms of the time to first chunk and CPU on
    every response (bench/bench_gateway.py). Here one plain task waits for
    ``http.disconnect``. ``on_leave`` runs once when the caller leaves before the end.
    """

    media_type = "text/event-stream"

    def __init__(
        self, outbox: Outbox, headers: Mapping[str, str], on_leave: Callable[[], None]
    ) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers(headers)
        self._outbox = outbox
        self._on_leave = on_leave
        self._left = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
        watcher: asyncio.Future[None] | None = None
        completed = False
        try:
            await send(start)  # before the watcher starts: it is not on the way to the first bytes

            def write(data: bytes, last: bool) -> Awaitable[None]:  # no coroutine of its own
                return send({"type": "http.response.body", "body": data, "more_body": not last})

            now = scope.get("extensions", {}).get(BODY_NOW, {}).get("write")  # our server's
            self._outbox.attach(write, self._leave, now)
            watcher = asyncio.ensure_future(self._watch(receive))
            last = False
            while not last and (data := await self._outbox.get()) is not None:
                last = self._outbox.ended
                await self._outbox.write(data, last)
            if not self._outbox.detached:
                if not last:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                completed = True
        finally:
            if watcher is not None:
                watcher.cancel()
            if not completed:
                self._leave()

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self._leave()

    def _leave(self) -> None:
        if not self._left:
            self._left = True
            self._on_leave()


def stream_output(codec: CallerCodec[R], req: R, same_dialect: bool, reply: Reply) -> CallerOutput:
    """A streaming caller's output: the provider's events forwarded (``same_dialect``) or the
    chunks encoded into the caller's dialect."""
    if same_dialect:
        return ForwardingOutput(codec.forwarder(req))
    return EncodingOutput(codec.encoder(req, reply))
