"""A small HTTP/1.1 client for provider streams (ADR 0009): one ``POST``, the body as it arrives.

It does only what a provider call needs, on the same C parser uvicorn uses (httptools), since
aiohttp's request machinery cost the gateway's time to first chunk (ADR 0009): HTTP/1.1 over
TCP or TLS, chunked, ``content-length`` and read-to-close bodies; a keep-alive pool per
origin (:data:`IDLE_PER_ORIGIN`); HTTP proxies and ``CONNECT`` tunnels; ``gzip``/``deflate``
decoded. Bounds: ``Timeouts.connect_s`` and ``Timeouts.read_s``, and at most
:data:`READ_BUFFER` bytes buffered before the socket is no longer read. Failures below HTTP
raise :class:`TransportError` with a stable ``code``. No redirects, no HTTP/2, no cookies.
"""

from __future__ import annotations

import asyncio
import base64
import os
import re
import socket
import ssl
import urllib.parse
import urllib.request
import zlib
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Final, cast

from tokenwire.providers._http_connection import READ_BUFFER, Connection, TransportError

__all__ = [
    "IDLE_PER_ORIGIN",
    "READ_BUFFER",
    "HttpClient",
    "HttpResponse",
    "PendingPost",
    "Timeouts",
    "TransportError",
    "check_header",
    "check_proxy",
    "check_url",
]

IDLE_PER_ORIGIN: Final = 256
"""Idle connections kept per origin; one released beyond this is closed."""
_USER_AGENT: Final = "tokenwire"
_URL_CACHE: Final = 1024
_OWN_HEADERS: Final = frozenset({"host", "content-length", "transfer-encoding", "connection"})
_TOKEN: Final = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
"""A header name (RFC 9110 token)."""
_VISIBLE: Final = r"[\x21-\x7e\x80-\xff]+"
_FIELD_VALUE: Final = re.compile(rf"(?:{_VISIBLE}(?:[ \t]+{_VISIBLE})*)?")
"""A header value (RFC 9110 field-value; h11, httpx's HTTP/1.1 layer, requires the same):
visible ASCII or latin-1 characters, spaces and tabs only between them; no control character
or line break."""
_URL_UNSAFE: Final = re.compile(r"[\x00-\x20\x7f]")
_PATH_SAFE: Final = "/%:@!$&'()*+,;=-._~?"
"""Left as they are in a path or query; anything else (a space, a control character) is
percent-encoded, so a model name from a request cannot break the request line."""
_MAX_TUNNEL_ANSWER: Final = 16 * 1024


def _quote(text: str) -> str:
    return urllib.parse.quote(text, safe=_PATH_SAFE)


def check_header(name: str, value: str) -> None:
    """``ValueError`` unless ``name: value`` can go in a request's head: ``name`` a token,
    ``value`` a field value (no line break, no control character, nothing outside latin-1, no
    space at either end). What :meth:`HttpClient.send` refuses; the message names the header,
    never its value (it may be a credential)."""
    if not _TOKEN.fullmatch(name) or not _FIELD_VALUE.fullmatch(value):
        raise ValueError(f"the request header {name!r} is not a valid name and value")


def check_proxy(url: str) -> None:
    """``ValueError`` unless :class:`HttpClient` can use ``url`` as its proxy (``HTTP_PROXY``,
    ``HTTPS_PROXY``): ``http://``, a host, a valid port. The message never repeats the URL."""
    _Proxy.parse(url)


def check_url(url: str) -> None:
    """``ValueError`` unless :meth:`HttpClient.send` can post to ``url`` as it is written: an
    ``http://`` or ``https://`` URL with a host (and a port from 0 to 65535), without spaces or
    control characters (``urllib`` would drop a line break silently), whose host can be the
    ``host`` header. The message never repeats the URL (it may hold a password)."""
    if _URL_UNSAFE.search(url):
        raise ValueError("a URL holds no space, line break or control character")
    try:
        netloc = _Target.parse(url).netloc
    except ValueError:
        raise ValueError("expected http:// or https://, a host and a valid port") from None
    try:
        check_header("host", netloc)
    except ValueError:
        raise ValueError("the host cannot be sent as the host header (ASCII or latin-1)") from None


@dataclass(frozen=True, slots=True)
class Timeouts:
    """``connect_s``: TCP, proxy tunnel and TLS handshake together; ``read_s``: the longest
    silence while a response is read (a stalled provider fails the call). No total: a long
    answer may stream for minutes."""

    connect_s: float = 10.0
    read_s: float = 120.0


@dataclass(frozen=True, slots=True)
class _Target:
    """Where a URL points: origin, ``host`` header and request path."""

    tls: bool
    host: str
    port: int
    netloc: str  # the host header: host[:port] as the URL wrote it, without credentials
    path: str  # path and query

    @classmethod
    def parse(cls, url: str) -> _Target:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        netloc = parts.netloc.rpartition("@")[2]
        path = _quote(parts.path or "/") + (f"?{_quote(parts.query)}" if parts.query else "")
        return cls(tls, parts.hostname, port, netloc, path)


@dataclass(frozen=True, slots=True)
class _Proxy:
    host: str
    port: int
    authorization: str | None  # the Proxy-Authorization value, from the URL's credentials

    @classmethod
    def parse(cls, url: str) -> _Proxy:
        try:
            parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
            port = parts.port
        except ValueError:
            port, parts = -1, urllib.parse.urlsplit("")
        if parts.scheme != "http" or not parts.hostname or port == -1:
            # never the URL itself: it may hold the proxy's password
            raise ValueError("a proxy is http://[user:password@]host[:port] (no https:// proxy)")
        auth = None
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            secret = urllib.parse.unquote(parts.password or "")
            auth = "Basic " + base64.b64encode(f"{user}:{secret}".encode()).decode()
        return cls(parts.hostname, port or 80, auth)


_PoolKey = tuple[bool, str, int, _Proxy | None]


class HttpResponse:
    """One response: ``status``, ``reason``, ``headers`` (lower-case names), the body by reads.

    Call :meth:`release` when done: a response read to its end gives its connection back to
    the pool; one left unread closes it.
    """

    def __init__(self, client: HttpClient, key: _PoolKey, conn: Connection) -> None:
        self._client = client
        self._key = key
        self._conn = conn
        self._released = False
        self.status = conn.status
        self.reason = conn.reason
        self.headers = conn.headers
        encoding = conn.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("identity", "gzip", "deflate", "x-gzip"):
            conn.close()
            raise TransportError("transport_error", f"unsupported content-encoding {encoding!r}")
        # wbits 47: a gzip or zlib header, detected
        self._inflate = zlib.decompressobj(47) if encoding != "identity" else None

    def read(self) -> Awaitable[bytes]:
        """The body bytes of the next socket reads (waiting for some); ``b""`` at the end.
        Raises :class:`TransportError` (after every byte that arrived before it).

        A plain body is the connection's own read, not a coroutine around it: one frame
        fewer to create and resume per read (paced streams bring about one token a read)."""
        if self._inflate is None:
            return self._conn.next_data()
        return self._read_inflated()

    def hold(self) -> None:
        """Stop reading the socket until the next :meth:`read` (``Connection.hold``)."""
        self._conn.hold()

    async def _read_inflated(self) -> bytes:
        while True:
            data = await self._conn.next_data()
            decoded = self._decode(data)
            if decoded or not data:  # a read that decodes to nothing is not the end
                return decoded

    def _decode(self, data: bytes) -> bytes:
        """Inflate ``data`` (every gzip member of it); at the end (``b""``), check the
        compressed body was complete."""
        assert self._inflate is not None  # compressed
        if not data:
            if not self._inflate.eof:
                raise TransportError("incomplete_body", "the compressed body ended early")
            return b""
        out = []
        try:
            while data:
                out.append(self._inflate.decompress(data))
                data = self._inflate.unused_data if self._inflate.eof else b""
                if data:  # another gzip member follows
                    self._inflate = zlib.decompressobj(47)
        except zlib.error as exc:
            raise TransportError("transport_error", f"undecodable compressed body: {exc}") from exc
        return b"".join(out)

    async def read_up_to(self, limit: int) -> bytes:
        """At most ``limit`` bytes of the body (an error body: the rest is not read)."""
        body = b""
        while len(body) < limit and (data := await self.read()):
            body += data
        return body[:limit]

    def release(self) -> None:
        """Give the connection back (read to its end) or close it; once."""
        if not self._released:
            self._released = True
            self._client.give_back(self._key, self._conn)


class PendingPost:
    """A ``POST`` on its way (:meth:`HttpClient.send`): written at once on a pooled connection,
    else when :meth:`response` has connected. :meth:`response` is awaited once; a post whose
    response is not wanted is given up with :meth:`cancel` (its connection is closed)."""

    def __init__(
        self, client: HttpClient, url: str, body: bytes, headers: Mapping[str, str]
    ) -> None:
        self._client = client
        self._error: ValueError | None = None
        self._conn: Connection | None = None  # the pooled connection the request went out on
        self._settled = False
        try:
            self._target, self._proxy = client._route(url)
            # ValueError before connecting: raised by response()
            self._request = _head(self._target, self._proxy, headers, len(body)) + body
        except ValueError as exc:
            self._error = exc
            return
        self._key: _PoolKey = (self._target.tls, self._target.host, self._target.port, self._proxy)
        self._conn = client._pooled(self._key)
        if self._conn is not None:
            self._conn.send(self._request)

    async def response(self) -> HttpResponse:
        """The response once its headers arrived; raises as :meth:`HttpClient.post` does."""
        assert not self._settled, "a pending post is answered once"
        self._settled = True
        if self._error is not None:
            raise self._error
        client, pooled = self._client, self._conn
        if pooled is not None:
            try:
                return await client._answer(self._key, pooled)
            except TransportError:
                if not pooled.closed_before_answering():
                    raise
            # A reused connection the server closed without a byte of an answer (it was
            # closing the idle connection as the request went out): sent once more on a fresh
            # connection, as urllib3 and httpx do for a stale pooled connection.
        conn = await client._connect(self._target, self._proxy)
        return await client._exchange(self._key, conn, self._request)

    def cancel(self) -> None:
        """The response is not wanted: the connection the request went out on is closed
        (its answer can never be read). Nothing once :meth:`response` was awaited."""
        if not self._settled:
            self._settled = True
            if self._conn is not None:
                self._conn.close()


class HttpClient:
    """Pooled HTTP/1.1 ``POST`` for provider calls; build it in the event loop, :meth:`close`
    it when done.

    Proxies come from ``proxies`` (scheme to proxy URL, with ``no`` for the bypass list) or, by
    default, from the environment (``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``), read once.
    """

    def __init__(
        self,
        timeouts: Timeouts | None = None,
        keepalive_s: float = 2.0,
        ssl_context: ssl.SSLContext | None = None,
        proxies: Mapping[str, str] | None = None,
    ) -> None:
        self._timeouts = timeouts or Timeouts()
        self._keepalive_s = keepalive_s
        self._ssl = ssl_context
        self._proxies = dict(
            urllib.request.getproxies_environment() if proxies is None else proxies
        )
        self._idle: dict[_PoolKey, list[Connection]] = {}
        self._targets: dict[str, tuple[_Target, _Proxy | None]] = {}
        self._closed = False

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> HttpResponse:
        """Send ``body`` to ``url`` and return once the response's headers arrived.

        Raises :class:`TransportError` (connect, tunnel, TLS, a closed connection, silence)
        and ``ValueError`` for a URL that is not http(s) or a header holding a line break.
        """
        return await self.send(url, body, headers).response()

    def send(self, url: str, body: bytes, headers: Mapping[str, str]) -> PendingPost:
        """:meth:`post` in two halves: the request is written now when a pooled connection
        can take it (else once :meth:`PendingPost.response` has connected), so that the
        provider works while the caller does something else. Never raises: a failure is
        :meth:`PendingPost.response`'s. Await that once, or :meth:`PendingPost.cancel`."""
        return PendingPost(self, url, body, headers)

    async def _exchange(self, key: _PoolKey, conn: Connection, request: bytes) -> HttpResponse:
        conn.send(request)
        return await self._answer(key, conn)

    async def _answer(self, key: _PoolKey, conn: Connection) -> HttpResponse:
        """The response to the request written on ``conn``, once its headers arrived."""
        try:
            await conn.wait_headers()
            return HttpResponse(self, key, conn)
        except BaseException:
            conn.close()
            raise

    def _proxy_url(self, url: str) -> str | None:
        """The proxy URL the environment (or ``proxies``) gives for ``url``, or ``None``."""
        parts = urllib.parse.urlsplit(url)
        # proxy_bypass_environment is the stdlib's own NO_PROXY matcher, but typeshed's stubs
        # do not declare it: hence the one ignore.
        bypass = urllib.request.proxy_bypass_environment(  # type: ignore[attr-defined]  # in urllib.request, not in typeshed's stub
            parts.netloc, self._proxies
        )
        return None if bypass else self._proxies.get(parts.scheme)

    def give_back(self, key: _PoolKey, conn: Connection) -> None:
        """Pool ``conn`` if it can carry another request, else close it."""
        idle = self._idle.setdefault(key, [])
        if self._closed or not conn.reusable() or len(idle) >= IDLE_PER_ORIGIN:
            conn.close()
            return
        conn.park(
            asyncio.get_running_loop().call_later(self._keepalive_s, self._expire, idle, conn)
        )
        idle.append(conn)

    async def close(self) -> None:
        """Close every idle connection; responses still being read close on release."""
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()

    # -- inside ------------------------------------------------------------------------------

    @staticmethod
    def _expire(idle: list[Connection], conn: Connection) -> None:
        """An idle connection's keep-alive ran out (or it was closed): out of the pool."""
        if conn in idle:
            idle.remove(conn)
        conn.close()

    def _route(self, url: str) -> tuple[_Target, _Proxy | None]:
        routed = self._targets.get(url)
        if routed is None:
            proxy_url = self._proxy_url(url)
            routed = (_Target.parse(url), _Proxy.parse(proxy_url) if proxy_url else None)
            if len(self._targets) >= _URL_CACHE:
                self._targets.clear()
            self._targets[url] = routed
        return routed

    def _pooled(self, key: _PoolKey) -> Connection | None:
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if conn.take():
                return conn
        return None

    async def _connect(self, target: _Target, proxy: _Proxy | None) -> Connection:
        loop = asyncio.get_running_loop()
        where = f"{target.host}:{target.port}" + (
            f" via {proxy.host}:{proxy.port}" if proxy else ""
        )
        try:
            async with asyncio.timeout(self._timeouts.connect_s):
                return await self._open(loop, target, proxy)
        except TimeoutError:
            detail = f"no connection within {self._timeouts.connect_s:g} s"
            raise TransportError("connect_timeout", detail, where=where) from None
        except OSError as exc:  # refused, unresolvable, unreachable, TLS (ssl.SSLError)
            # The caller learns why the provider could not be reached, not where it lives.
            detail = f"cannot connect: {_why_not(exc)}"
            raise TransportError("connect_error", detail, where=f"{where}: {exc}") from exc

    async def _open(
        self, loop: asyncio.AbstractEventLoop, target: _Target, proxy: _Proxy | None
    ) -> Connection:
        tls = self._context() if target.tls else None
        conn = Connection(loop, self._timeouts.read_s)
        if proxy is None:
            await loop.create_connection(
                lambda: conn,
                target.host,
                target.port,
                ssl=tls,
                server_hostname=target.host if tls else None,
            )
            return conn
        if tls is None:  # plain HTTP through the proxy: absolute-form requests
            await loop.create_connection(lambda: conn, proxy.host, proxy.port)
            return conn
        tunnel = _Tunnel(loop)
        raw, _ = await loop.create_connection(lambda: tunnel, proxy.host, proxy.port)
        try:
            await tunnel.open(target, proxy)
            secured = await loop.start_tls(raw, conn, tls, server_hostname=target.host)
            if secured is None:  # only a loop without TLS support answers so
                raise ConnectionError("the event loop could not start TLS on the tunnel")
        except BaseException:
            raw.close()
            raise
        conn.connection_made(secured)
        return conn

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = ssl.create_default_context()
        return self._ssl


class _Tunnel(asyncio.Protocol):
    """The ``CONNECT`` exchange with a proxy, before TLS takes the connection over."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._answer: asyncio.Future[bytes] = loop.create_future()
        self._head = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        self._head += data
        if self._answer.done():
            return
        if b"\r\n\r\n" in self._head:
            self._answer.set_result(self._head)
        elif len(self._head) > _MAX_TUNNEL_ANSWER:
            self._answer.set_exception(ConnectionError("the proxy's answer has no end"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self._answer.done():
            self._answer.set_exception(ConnectionError("the proxy closed the connection"))

    async def open(self, target: _Target, proxy: _Proxy) -> None:
        """Ask for the tunnel; raises ``ConnectionError`` unless the proxy answers 2xx."""
        assert self.transport is not None  # connected
        host = f"[{target.host}]" if ":" in target.host else target.host  # IPv6
        authority = f"{host}:{target.port}"
        lines = [f"CONNECT {authority} HTTP/1.1", f"host: {authority}"]
        if proxy.authorization:
            lines.append(f"proxy-authorization: {proxy.authorization}")
        self.transport.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        head = await self._answer
        status_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = status_line.split(" ", 2)
        if (
            len(parts) < 2
            or not parts[1].startswith("2")
            or head.index(b"\r\n\r\n") + 4 != len(head)
        ):
            raise ConnectionError(f"the proxy refused the tunnel: {status_line!r}")


def _head(target: _Target, proxy: _Proxy | None, headers: Mapping[str, str], length: int) -> bytes:
    """The request line and headers; ``ValueError`` for a header :func:`check_header` refuses,
    or a host outside latin-1."""
    absolute = proxy is not None and not target.tls
    path = f"http://{target.netloc}{target.path}" if absolute else target.path
    lines = [f"POST {path} HTTP/1.1\r\nhost: {target.netloc}\r\ncontent-length: {length}\r\n"]
    given = set()
    for name, value in headers.items():
        check_header(name, value)
        if name.lower() in _OWN_HEADERS:
            continue  # framing is this client's
        lines.append(f"{name}: {value}\r\n")
        given.add(name.lower())
    if "accept-encoding" not in given:
        lines.append("accept-encoding: identity\r\n")
    if "user-agent" not in given:
        lines.append(f"user-agent: {_USER_AGENT}\r\n")
    if absolute and proxy is not None and proxy.authorization:
        lines.append(f"proxy-authorization: {proxy.authorization}\r\n")
    lines.append("\r\n")
    try:
        return "".join(lines).encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError("a request header value is not a valid name and value (latin-1)") from None


def _why_not(exc: OSError) -> str:
    """Why a connection failed, without the address the OS's message names: TLS's reason,
    the tunnel's refusal, or the error number's meaning (``Connection refused``)."""
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or type(exc).__name__}"
    if type(exc) is ConnectionError:  # raised here: the proxy's answer, never an address
        return str(exc)
    if isinstance(exc, socket.gaierror):  # its text names no host: "Name or service not known"
        return exc.strerror or "the name did not resolve"
    if exc.errno is not None:
        return os.strerror(exc.errno)
    return type(exc).__name__
