"""One HTTP/1.1 connection to a provider and the response being read on it (ADR 0009).

An ``asyncio.Protocol`` around httptools' response parser: body bytes are collected by the
parser's callbacks and handed over per socket read (:meth:`Connection.next_data`). Bounds:
at most :data:`READ_BUFFER` bytes held unread before the socket is no longer read; a
watchdog (one timer per response, re-armed lazily, not per read) fails a response after
``read_s`` of silence that is the provider's (not while reading is paused). Informational
(1xx) responses are skipped; bytes after a complete response end the connection; trailers
stay out of the headers. Failures are :class:`TransportError` with a stable ``code``.
"""

from __future__ import annotations

import asyncio
from typing import Final, cast

import httptools

READ_BUFFER: Final = 1 << 20
"""Bytes of one response held unread before the connection stops reading the socket."""


class TransportError(Exception):
    """A provider call failed below HTTP. ``code`` is one of ``connect_error``,
    ``connect_timeout``, ``read_timeout``, ``incomplete_body``, ``server_disconnected``,
    ``transport_error`` (an invalid response). ``str()`` is what a caller may be told;
    ``where`` (the host and port it tried, the OS's own words) goes only to the log."""

    def __init__(self, code: str, detail: str, *, where: str = "") -> None:
        super().__init__(detail)
        self.code = code
        self.where = where


class _BytesAfterResponseError(Exception):
    """Bytes after a complete response (raised into httptools to stop its parse)."""


class Connection(asyncio.Protocol):
    """One connection and the response being read on it (one at a time)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_s: float) -> None:
        self._loop = loop
        self._read_s = read_s
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._idle_timer: asyncio.TimerHandle | None = None
        self._watchdog: asyncio.TimerHandle | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._begin()

    def _begin(self) -> None:
        """Fresh state for the next response."""
        self._parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}
        self.headers_done = False
        self._informational = False
        self._keep_alive = False
        self.complete = False
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._error: TransportError | None = None
        self._last_read = self._loop.time()
        self._received = 0

    # -- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        self._received += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            if not self.complete:  # bytes after a complete response only end the connection
                self._fail("transport_error", f"invalid HTTP response from the provider: {exc}")
            self.close()
            self._wake()
            return
        if self._buffered > READ_BUFFER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        return False  # close; connection_lost settles the response

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._watchdog is not None:  # an idle timer runs on: it takes the entry out of the pool
            self._watchdog.cancel()
            self._watchdog = None
        if not self.complete and self._error is None:
            if not self.headers_done:
                self._fail("server_disconnected", "the provider closed the connection")
            elif self._reads_to_close() and exc is None:
                self.complete = True
            else:
                detail = f": {exc}" if exc else ""
                self._fail("incomplete_body", f"the provider's body ended early{detail}")
        self._wake()

    # -- httptools callbacks ---------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:  # more bytes after the response: the connection cannot be trusted
            raise _BytesAfterResponseError

    def on_status(self, reason: bytes) -> None:
        self.reason = reason.decode("latin-1")

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.headers_done:
            return  # a chunked body's trailers: not the response's headers
        key, text = name.decode("latin-1").lower(), value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # informational (103 Early Hints, 100): the answer follows
            self._informational = True
            self.headers = {}
            return
        self.status = status
        self._keep_alive = self._parser.should_keep_alive()  # llhttp forgets it at the end
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self._buffer.append(body)
        self._buffered += len(body)

    def on_message_complete(self) -> None:
        if self._informational:
            self._informational = False
            return
        self.complete = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    # -- the client's side -----------------------------------------------------------------

    def send(self, data: bytes) -> None:
        """Write a request; its response is read from now on, silence bounded by ``read_s``."""
        assert self.transport is not None  # connected
        self._cancel_timers()
        self._begin()
        self.transport.write(data)
        self._watchdog = self._loop.call_at(self._last_read + self._read_s, self._check_silence)

    async def wait_headers(self) -> None:
        """Until the response's status and headers arrived; raises its TransportError."""
        while not self.headers_done:
            if self._error is not None:
                raise self._error
            await self._wait()

    def hold(self) -> None:
        """Stop reading the socket until :meth:`next_data` is called again: what the provider
        sends meanwhile waits in the kernel's buffer, and one read takes all of it (a caller
        that coalesces its reads). The silence is ours: the watchdog does not count it."""
        if not self._paused and self.transport is not None and not self.complete:
            self._paused = True
            self.transport.pause_reading()

    async def next_data(self) -> bytes:
        """Everything read since the last call (waiting for some); ``b""`` at the end."""
        if self._paused and not self._buffer:  # held (:meth:`hold`): read the socket again
            self._resume()
        while not self._buffer:
            if self.complete:
                return b""
            if self._error is not None:
                raise self._error
            # _wait inlined: one coroutine fewer per read (most reads bring one token)
            self._waiter = waiter = self._loop.create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        data = self._buffer[0] if len(self._buffer) == 1 else b"".join(self._buffer)
        self._buffer = []
        self._buffered = 0
        if self._paused:
            self._resume()
        return data

    def _resume(self) -> None:
        """Read the socket again after a pause (a full buffer, or :meth:`hold`)."""
        self._paused = False
        self._last_read = self._loop.time()  # the silence was ours, not the provider's
        if self.transport is not None:
            self.transport.resume_reading()

    def closed_before_answering(self) -> bool:
        """The server closed the connection without a byte of the response (the stale
        keep-alive case: it closed an idle connection as the request went out). Not one this
        side closed after ``read_s`` of silence: the provider may be working on the request."""
        disconnected = self._error is not None and self._error.code == "server_disconnected"
        return disconnected and self.closed and self._received == 0 and not self.headers_done

    def reusable(self) -> bool:
        """Read to its end, nothing left over, and both sides keep the connection."""
        return (
            self.complete
            and self._error is None
            and not self._buffer
            and not self._paused  # a held socket is never handed to the next request
            and not self.closed
            and self._keep_alive
        )

    def park(self, expiry: asyncio.TimerHandle) -> None:
        """Idle in the pool until taken or ``expiry`` runs."""
        self._idle_timer = expiry

    def take(self) -> bool:
        """Taken from the pool: whether it is still usable."""
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        """Close the connection (a response being read fails, unless complete)."""
        self._cancel_timers()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self.closed = True

    # -- inside ------------------------------------------------------------------------------

    def _check_silence(self) -> None:
        self._watchdog = None
        if self.complete or self._error is not None or self.closed:
            return
        now = self._loop.time()
        if self._paused:  # the silence is ours (an unread buffer), not the provider's
            self._watchdog = self._loop.call_at(now + self._read_s, self._check_silence)
            return
        due = self._last_read + self._read_s
        if now < due:
            self._watchdog = self._loop.call_at(due, self._check_silence)
            return
        self._fail("read_timeout", f"the provider sent nothing for {self._read_s:g} s")
        self.close()
        self._wake()

    def _reads_to_close(self) -> bool:
        """A body framed by the end of the connection (neither length nor chunked)."""
        chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        return "content-length" not in self.headers and not chunked

    def _fail(self, code: str, detail: str) -> None:
        if self._error is None:
            self._error = TransportError(code, detail)

    def _cancel_timers(self) -> None:
        for timer in (self._watchdog, self._idle_timer):
            if timer is not None:
                timer.cancel()
        self._watchdog = self._idle_timer = None

    async def _wait(self) -> None:
        self._waiter = self._loop.create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
