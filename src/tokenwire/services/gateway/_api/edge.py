"""The HTTP edge's bounds, enforced in uvicorn's httptools protocol before the app runs.

uvicorn bounds header size only for h11 and answers its concurrency limit in plain text, and
nothing bounds the time to send headers or a body. So the gateway runs a subclass of
uvicorn's ``HttpToolsProtocol`` that adds, per connection: header bytes and count (431),
header and body read timeouts (408), open connections and running requests (503 with
``retry-after``), each answered in the dialect of the path, then the connection closed. It
also writes a response's head with its first body bytes (:class:`HeadWithBody`: one socket
write, one wake-up fewer), offers the app a plain function that writes a piece of a chunked
body at once (:class:`BodyNow`, the ``BODY_NOW`` scope extension: no coroutine and no
message per piece) and reads a request's headers once (:func:`header_map`).
docs/gateway.md, "Publishing semantics" and "Performance".
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import httptools
from starlette.types import Scope
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from tokenwire import variables as v
from tokenwire.services.gateway._dialects.anthropic_messages import anthropic_error_body
from tokenwire.services.gateway._dialects.openai_chat import openai_error_body
from tokenwire.services.gateway._output.caller import BODY_NOW

KEEP_ALIVE_S = 75
"""How long an idle keep-alive connection stays open (uvicorn's default is 5 s). Longer than
the SDKs' pool expiry (httpx's ``keepalive_expiry``, 5 s): a server closing at the same moment
a client reuses the connection makes the client's request fail before any response byte."""


def header_map(scope: Scope) -> dict[str, str]:
    """The request's headers as a plain dict, the first of a repeated name winning (as
    Starlette's ``Headers`` reads them). A model call reads a dozen names, most of them absent;
    ``Headers`` decodes and scans every header and raises ``KeyError`` for each absent one."""
    return {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in reversed(scope["headers"])
    }


_REASONS = {
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}
_ANTHROPIC_TYPES = {408: "timeout_error", 431: "request_too_large", 503: "overloaded_error"}


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    """Bounds of the HTTP edge (docs/configuration.md, ``TOKENWIRE_GATEWAY_*``)."""

    max_header_bytes: int = v.GATEWAY_MAX_HEADER_BYTES.value
    max_headers: int = v.GATEWAY_MAX_HEADERS.value
    header_timeout_s: float = v.GATEWAY_HEADER_TIMEOUT_S.value
    body_timeout_s: float = v.GATEWAY_BODY_TIMEOUT_S.value
    max_connections: int = v.GATEWAY_MAX_CONNECTIONS.value
    max_requests: int = v.GATEWAY_MAX_REQUESTS.value
    retry_after_s: int = 1


def edge_error(status: int, path: str, message: str) -> bytes:
    """A whole HTTP response (closing the connection) in the path's dialect."""
    if path.startswith("/v1/messages"):
        body = anthropic_error_body(message, _ANTHROPIC_TYPES[status])
    else:
        kind = "invalid_request_error" if status < 500 else "api_error"
        body = openai_error_body(message, kind, param=None, code=None)
    retry = b"retry-after: 1\r\n" if status == 503 else b""
    head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" % (
        status,
        _REASONS[status],
        len(body),
    )
    return head + retry + b"connection: close\r\n\r\n" + body


def bounded_protocol(limits: EdgeLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with ``limits`` (pass it as ``uvicorn.Config(http=...)``)."""

    class Bounded(BoundedHttpToolsProtocol):
        edge = limits

    return Bounded


class HeadWithBody(asyncio.Transport):
    """A request cycle's view of the connection: its first write (the status line and
    headers) is held until the next one, at most until the event loop's next turn, and both
    go out in one socket write. The app sends the start and the first body in the same turn
    when it has them (``StepStream``, Starlette's responses); an app that starts a response
    and waits for its body has the head written at the next turn, as before."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._first = True

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held + bytes(data))
        elif self._first:
            self._first = False
            self._held = bytes(data)
            self._loop.call_soon(self._release)
        else:
            self._transport.write(data)

    def _release(self) -> None:
        if self._held is not None:
            held, self._held = self._held, None
            if not self._transport.is_closing():
                self._transport.write(held)

    def close(self) -> None:
        self._release()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)


class BodyNow:
    """Writes one piece of a started chunked response body at once, as uvicorn's ``send`` of
    ``{"type": "http.response.body", "body": data, "more_body": True}`` writes it, without the
    coroutine and the message: the streaming caller's hot path (one write per provider read).

    :meth:`write` returns False and writes nothing whenever ``send`` would do anything else
    or wait: the response not started, not chunked or complete, the caller gone, the socket's
    buffer full (uvicorn's flow control); the caller then uses ``send``.
    """

    __slots__ = ("_cycle",)

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = cycle

    def write(self, data: bytes) -> bool:
        cycle = self._cycle
        if (
            not data
            or not cycle.response_started
            or cycle.response_complete
            or cycle.disconnected
            or cycle.flow.write_paused
            or not cycle.chunked_encoding
            or cycle.scope["method"] == "HEAD"
        ):
            return False
        cycle.transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        return True


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """See the module docstring; ``edge`` is set by :func:`bounded_protocol`."""

    edge = EdgeLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_bytes = 0
        self._header_count = 0
        self._timer: asyncio.TimerHandle | None = None
        self._rejected = False
        self._in_head = True  # reading a request line and headers
        self._head_seen = 0  # raw bytes of them so far (httptools buffers a header whole)
        self._head_start = b""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn's protocol takes the transport asyncio gives
        super().connection_made(transport)
        self._arm(self.edge.header_timeout_s, "headers")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        if self._in_head and self._head_too_large(data):
            self._reject(431, f"request line and headers exceed {self.edge.max_header_bytes} bytes")
            return
        super().data_received(data)

    def _head_too_large(self, data: bytes) -> bool:
        """Count raw head bytes before httptools sees them: it buffers a header's value
        whole before its callback, so counting in ``on_header`` alone bounds nothing."""
        if self._head_seen == 0:
            self._head_start = data[:512]  # the request line, for the error's dialect
        end = data.find(b"\r\n\r\n")
        self._head_seen += len(data) if end < 0 else end
        return self._head_seen > self.edge.max_header_bytes

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._header_bytes = self._header_count = 0
        if self._timer is None:
            self._arm(self.edge.header_timeout_s, "headers")

    def on_url(self, url: bytes) -> None:
        self._header_bytes += len(url)
        if self._header_bytes > self.edge.max_header_bytes:
            self._reject(431, f"request line and headers exceed {self.edge.max_header_bytes} bytes")
            return
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_bytes += len(name) + len(value) + 4
        self._header_count += 1
        if self._header_bytes > self.edge.max_header_bytes:
            self._reject(431, f"request line and headers exceed {self.edge.max_header_bytes} bytes")
        elif self._header_count > self.edge.max_headers:
            self._reject(431, f"more than {self.edge.max_headers} request headers")
        else:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._rejected:
            return
        self._in_head = False
        self._head_seen = 0
        self._disarm()
        if (
            len(self.connections) > self.edge.max_connections
            or len(self.tasks) >= self.edge.max_requests
        ):
            self._reject(503, "the gateway is at its concurrency limit; retry shortly")
            return
        super().on_headers_complete()
        if self.cycle is not None and self.cycle.transport is self.transport:
            self.cycle.transport = HeadWithBody(self.transport, self.loop)
            now: dict[object, object] = {"write": BodyNow(self.cycle).write}
            self.scope["extensions"] = {**(self.scope.get("extensions") or {}), BODY_NOW: now}
        if not self.parser.should_upgrade():
            self._arm(self.edge.body_timeout_s, "body")

    def on_body(self, body: bytes) -> None:
        if not self._rejected:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._disarm()
        if not self._rejected:
            super().on_message_complete()

    def _arm(self, delay_s: float, what: str) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay_s, self._timed_out, what, delay_s)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _timed_out(self, what: str, delay_s: float) -> None:
        self._timer = None
        if self.cycle is not None and self.cycle.response_started:
            self.transport.close()  # the app answered already; the body just stopped coming
            return
        self._reject(408, f"the request {what} did not arrive within {delay_s:g} s")

    def _reject(self, status: int, message: str) -> None:
        if self._rejected:
            return
        self._rejected = True
        self._disarm()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        if not self.transport.is_closing():
            self.transport.write(edge_error(status, self._path(), message))
            self.transport.close()

    def _path(self) -> str:
        """The request's path, from the parsed URL or else the raw request line."""
        url = getattr(self, "url", b"") or self._head_start.split(b" ", 2)[1:2] or [b"/"]
        raw = url if isinstance(url, bytes) else url[0]
        try:
            return (httptools.parse_url(raw).path or b"/").decode("ascii", "replace")
        except httptools.HttpParserInvalidURLError:
            return "/"
