"""One provider response over HTTP: bytes -> SseParser -> normaliser -> stream chunks.

The HTTP client is aiohttp (ADR 0007): its C parser hands over everything one socket read
brought, where httpx went through h11 once per HTTP chunk (one per SSE event), which cost the
gateway about three times the CPU per event and ~0.7 ms more to the first byte
(bench/bench_upstream.py).
"""

from __future__ import annotations

import ssl
import urllib.parse
import urllib.request
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Final

import aiohttp
import msgspec

from tokenwire.providers._base import Normaliser
from tokenwire.providers._builder import step_error
from tokenwire.providers._errors import ProviderHTTPError, is_retryable
from tokenwire.schemas import Finish, StreamChunk
from tokenwire.sse import SseError, SseParser

__all__ = [
    "DEFAULT_TIMEOUT",
    "KEEPALIVE_S",
    "ProviderRequest",
    "ProviderSession",
    "stream_batches",
    "stream_chunks",
    "transport_code",
]

DEFAULT_TIMEOUT: Final = aiohttp.ClientTimeout(
    total=None, connect=30.0, sock_connect=10.0, sock_read=120.0
)
"""Bounds for a provider call: ``sock_connect`` for the TCP/TLS connection, ``connect`` for
that plus any wait for a pooled connection, ``sock_read`` the longest silence between bytes
(a stalled provider ends the step). No total: a long answer may stream for minutes."""
KEEPALIVE_S: Final = 2.0
"""Idle provider connections are closed after this long. Servers keep idle connections at
least this long (uvicorn 5 s, nginx 75 s), so a reused connection is not one the server is
closing at that moment (that race failed steps with a 502 under load)."""
_MAX_ERROR_BODY: Final = 64 * 1024  # an error body is read up to this many bytes
_CREDENTIAL_HEADERS: Final = ("authorization", "x-api-key", "api-key", "x-goog-api-key")


@dataclass(frozen=True, slots=True)
class ProviderRequest:
    """One streaming ``POST`` to a provider: the URL, the JSON body and its headers."""

    url: str
    body: bytes
    headers: Mapping[str, str]


class _ErrorBody(msgspec.Struct):
    error: _ErrorObject | str | None = None
    message: str | None = None


class _ErrorObject(msgspec.Struct):
    message: str = ""
    code: str | int | None = None
    type: str | None = None


_error_body_decoder: Final = msgspec.json.Decoder(_ErrorBody | list[_ErrorBody])


class ProviderSession:
    """A pooled client for provider calls. Build it inside the event loop; ``close`` it (or
    ``async with ProviderSession() as session: ...``).

    No connection limit (the gateway's concurrency is bounded by its callers), the system CA
    bundle loaded once, and proxies from the environment (``HTTPS_PROXY``, ``HTTP_PROXY``,
    ``NO_PROXY``) read once at construction: aiohttp's own ``trust_env`` reads the
    environment and ``~/.netrc`` on every request, ~0.4 ms of the time to first chunk.
    """

    def __init__(
        self, timeout: aiohttp.ClientTimeout = DEFAULT_TIMEOUT, keepalive_s: float = KEEPALIVE_S
    ) -> None:
        connector = aiohttp.TCPConnector(
            limit=0, keepalive_timeout=keepalive_s, ssl=ssl.create_default_context()
        )
        self.http = aiohttp.ClientSession(connector=connector, timeout=timeout)
        self._proxies = urllib.request.getproxies_environment()
        self._proxy_for: dict[tuple[str, str], str | None] = {}

    def proxy(self, url: str) -> str | None:
        """The proxy for ``url`` from the environment, or ``None`` (cached per scheme and host)."""
        parts = urllib.parse.urlsplit(url)
        key = (parts.scheme, parts.netloc)
        if key not in self._proxy_for:
            # proxy_bypass_environment is the stdlib's own NO_PROXY matcher, but typeshed's
            # stubs do not declare it: hence the one ignore.
            bypass = urllib.request.proxy_bypass_environment(  # type: ignore[attr-defined]
                parts.netloc, self._proxies
            )
            self._proxy_for[key] = None if bypass else self._proxies.get(parts.scheme)
        return self._proxy_for[key]

    async def close(self) -> None:
        """Close the pooled connections."""
        await self.http.close()

    async def __aenter__(self) -> ProviderSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def stream_batches(
    session: ProviderSession, request: ProviderRequest, normaliser: Normaliser
) -> AsyncGenerator[list[StreamChunk], None]:
    """Send ``request`` and yield its normalised chunks, those of each network read together
    (a list per read, maybe empty), ending with exactly one ``finish``.

    A non-2xx answer raises :class:`ProviderHTTPError` before any chunk (the provider's error
    text, never the request's headers). A transport failure or timeout, before or after the
    stream began, ends it with ``finish {error, retryable=True}`` after the chunks already
    yielded; its code is one of ``connect_error``, ``connect_timeout``, ``read_timeout``,
    ``incomplete_body``, ``server_disconnected``, ``transport_error``. Timeouts are the
    session's (:class:`ProviderSession`).

    A busy gateway reads dozens of events per read (65 on average under bench load (b)):
    handing them over as one list costs one generator step per read instead of two per chunk.
    """
    try:
        response = await session.http.post(
            request.url, data=request.body, headers=request.headers, allow_redirects=False,
            proxy=session.proxy(request.url),
        )  # fmt: skip
    except (aiohttp.ClientError, TimeoutError) as exc:
        yield [_transport_finish(exc)]
        return
    try:
        if not 200 <= response.status < 300:
            raise await _http_error(response, _secrets(request.headers))
        parser = SseParser()
        try:
            async for data in response.content.iter_any():
                yield [chunk for event in parser.feed(data) for chunk in normaliser.feed(event)]
        except (aiohttp.ClientError, TimeoutError) as exc:
            yield [_transport_finish(exc)]
            return
        except SseError as exc:
            yield [Finish(reason="error", error=step_error(str(exc), False, "sse"))]
            return
        yield normaliser.close()
    finally:
        response.release()  # back to the pool when read to the end, closed otherwise


async def stream_chunks(
    session: ProviderSession, request: ProviderRequest, normaliser: Normaliser
) -> AsyncGenerator[StreamChunk, None]:
    """:func:`stream_batches` one chunk at a time."""
    batches = stream_batches(session, request, normaliser)
    try:
        async for batch in batches:
            for chunk in batch:
                yield chunk
    finally:
        await batches.aclose()


def transport_code(exc: BaseException) -> str:
    """A stable code for a transport failure (stored with the step error)."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return "connect_timeout"
    if isinstance(exc, aiohttp.SocketTimeoutError | TimeoutError):
        return "read_timeout"
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "connect_error"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "incomplete_body"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "server_disconnected"
    return "transport_error"


def _transport_finish(exc: BaseException) -> Finish:
    code = transport_code(exc)
    detail = str(exc) or type(exc).__name__
    message = f"transport failure while streaming from the provider ({code}): {detail}"
    return Finish(reason="error", error=step_error(message, True, code))


def _secrets(headers: Mapping[str, str]) -> list[str]:
    """The credential values of the request, to scrub from anything we report."""
    lowered = {k.lower(): v for k, v in headers.items()}
    values = [lowered.get(name, "") for name in _CREDENTIAL_HEADERS]
    values = [v.removeprefix("Bearer ").strip() for v in values]
    return [v for v in values if len(v) >= 8]


async def _http_error(response: aiohttp.ClientResponse, secrets: list[str]) -> ProviderHTTPError:
    body = b""
    try:
        async for data in response.content.iter_any():
            body += data
            if len(body) >= _MAX_ERROR_BODY:
                break
    except (aiohttp.ClientError, TimeoutError):
        pass  # the status alone is enough to report
    message, code = _error_text(body[:_MAX_ERROR_BODY])
    for secret in secrets:  # some providers echo the key back (OpenAI masks it, others may not)
        message = message.replace(secret, "[redacted]")
    status = response.status
    reason = response.reason or f"HTTP {status}"
    return ProviderHTTPError(status, message or reason, is_retryable(status, code), code)


def _error_text(body: bytes) -> tuple[str, str | None]:
    """The provider's error message and code from an OpenAI/Anthropic/Gemini-style body."""
    try:
        decoded = _error_body_decoder.decode(body)
    except msgspec.DecodeError:
        return body.decode("utf-8", "replace").strip()[:500], None
    first = decoded[0] if isinstance(decoded, list) and decoded else decoded
    if not isinstance(first, _ErrorBody):
        return "", None
    if isinstance(first.error, _ErrorObject):
        err = first.error
        code = err.code if isinstance(err.code, str) else err.type
        return err.message, code
    return first.error or first.message or "", None
