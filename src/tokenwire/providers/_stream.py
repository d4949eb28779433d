"""One provider response over HTTP: bytes -> SseParser -> normaliser -> stream chunks.

The HTTP client is :class:`tokenwire.providers.HttpClient` (ADR 0009): a small HTTP/1.1
client on httptools that hands over everything one socket read brought, with none of a
general client's per-request machinery on the way to the first byte.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Final

import msgspec

from tokenwire.providers._base import Normaliser
from tokenwire.providers._builder import step_error
from tokenwire.providers._errors import ProviderHTTPError, is_retryable
from tokenwire.providers._http import (
    HttpClient,
    HttpResponse,
    PendingPost,
    Timeouts,
    TransportError,
)
from tokenwire.schemas import Finish, StreamChunk
from tokenwire.scrub import scrub
from tokenwire.sse import SseError, SseEvent, SseParser

log = logging.getLogger("tokenwire.providers")

__all__ = [
    "DEFAULT_TIMEOUTS",
    "KEEPALIVE_S",
    "ProviderRequest",
    "ProviderSession",
    "SentRequest",
    "stream_batches",
    "stream_chunks",
]

DEFAULT_TIMEOUTS: Final = Timeouts(connect_s=10.0, read_s=120.0)
"""Bounds for a provider call: 10 s for the TCP/TLS connection (and a proxy's tunnel), 120 s
the longest silence while the answer streams (a stalled provider ends the step). No total:
a long answer may stream for minutes."""
KEEPALIVE_S: Final = 2.0
"""Idle provider connections are closed after this long. Servers keep idle connections at
least this long (uvicorn 5 s, nginx 75 s), so a reused connection is not one the server is
closing at that moment (that race failed steps with a 502 under load)."""
_MAX_ERROR_BODY: Final = 64 * 1024  # an error body is read up to this many bytes
_CREDENTIAL_HEADERS: Final = ("authorization", "x-api-key", "api-key", "x-goog-api-key")


@dataclass(frozen=True, slots=True)
class ProviderRequest:
    """One streaming ``POST`` to a provider: the URL, the JSON body and its headers;
    ``provider``: its name, as a failure names it to the caller (never its URL)."""

    url: str
    body: bytes
    headers: Mapping[str, str]
    provider: str = ""


class _ErrorBody(msgspec.Struct):
    error: _ErrorObject | str | None = None
    message: str | None = None


class _ErrorObject(msgspec.Struct):
    message: str = ""
    code: str | int | None = None
    type: str | None = None


_error_body_decoder: Final = msgspec.json.Decoder(_ErrorBody | list[_ErrorBody])


class ProviderSession:
    """A pooled client for provider calls (:class:`tokenwire.providers.HttpClient`). Build it
    inside the event loop; ``close`` it (or ``async with ProviderSession() as session: ...``).

    No connection limit (the gateway's concurrency is bounded by its callers), the system CA
    bundle loaded once, and proxies from the environment (``HTTPS_PROXY``, ``HTTP_PROXY``,
    ``NO_PROXY``) read once at construction.
    """

    def __init__(self, timeouts: Timeouts = DEFAULT_TIMEOUTS, keepalive_s: float = KEEPALIVE_S):
        self.http = HttpClient(timeouts, keepalive_s)

    def send(self, request: ProviderRequest) -> SentRequest:
        """Send ``request`` now where a pooled connection can take it (see
        :class:`SentRequest`); read its answer with :meth:`SentRequest.batches`."""
        return SentRequest(self, request)

    async def close(self) -> None:
        """Close the pooled connections."""
        await self.http.close()

    async def __aenter__(self) -> ProviderSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class SentRequest:
    """A provider request already on its way (:meth:`ProviderSession.send`): written at once
    on a pooled connection, so that the provider works while the caller prepares to read.
    Read it once with :meth:`batches`, or give it up with :meth:`cancel`."""

    def __init__(self, session: ProviderSession, request: ProviderRequest) -> None:
        self._pending = session.http.send(request.url, request.body, request.headers)
        self._headers = request.headers
        self._provider = request.provider

    def batches(
        self, normaliser: Normaliser, every_s: float = 0.0
    ) -> AsyncGenerator[list[StreamChunk], None]:
        """The response's normalised chunks, a list per network read (see
        :func:`stream_batches`, whose contract this is). ``every_s``: once a read brought a
        chunk, each later read waits that long after the last, the socket unread meanwhile
        (coalesced reads: what the provider sends in between is taken in one read)."""
        return _batches(self._pending, self._headers, normaliser, every_s, self._provider)

    def cancel(self) -> None:
        """Give the request up unread (its connection is closed); nothing once :meth:`batches`
        began reading."""
        self._pending.cancel()


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
    The first read that brings a chunk is the exception: its chunks up to the first event
    that made any come alone, the rest of that read in the next list, so that the first
    chunk reaches the caller before the rest of its read is normalised and published.
    """
    batches = session.send(request).batches(normaliser)
    try:
        async for batch in batches:
            yield batch
    finally:
        await batches.aclose()


async def _batches(
    pending: PendingPost,
    headers: Mapping[str, str],
    normaliser: Normaliser,
    every_s: float,
    provider: str,
) -> AsyncGenerator[list[StreamChunk], None]:
    try:
        response = await pending.response()
    except TransportError as exc:
        yield [_transport_finish(exc, provider)]
        return
    try:
        if not 200 <= response.status < 300:
            raise await _http_error(response, _secrets(headers))
        parser = SseParser()
        try:
            started = False  # a read brought a chunk: coalescing may begin
            while data := await response.read():
                events = parser.feed(data)
                batch: list[StreamChunk] = []
                if not started:
                    batch, events = _through_first_chunk(events, normaliser)
                    started = bool(batch)
                    if started and events:
                        yield batch  # alone: the step answers its caller before the rest
                        batch = []
                for event in events:  # a loop, not a comprehension: no frame per read
                    batch += normaliser.feed(event)
                yield batch
                if every_s and started:
                    response.hold()
                    await asyncio.sleep(every_s)
        except TransportError as exc:
            yield [_transport_finish(exc, provider)]
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


def _through_first_chunk(
    events: list[SseEvent], normaliser: Normaliser
) -> tuple[list[StreamChunk], list[SseEvent]]:
    """The chunks of ``events`` fed up to the first one that made any, and the events after
    it, not fed yet (none made a chunk: ``([], [])``, every event fed)."""
    for i, event in enumerate(events):
        if chunks := normaliser.feed(event):
            return chunks, events[i + 1 :]
    return [], []


def _transport_finish(exc: TransportError, provider: str) -> Finish:
    """The step's recorded end: which provider failed and how, never where it lives (the
    host, port and the OS's words go to the log)."""
    which = f"provider {provider!r}" if provider else "the provider"
    if exc.where:
        log.warning("%s transport failure (%s): %s; %s", which, exc.code, exc, exc.where)
    message = f"transport failure while streaming from {which} ({exc.code}): {exc}"
    return Finish(reason="error", error=step_error(message, True, exc.code))


def _secrets(headers: Mapping[str, str]) -> list[str]:
    """The credential values of the request, to scrub from anything we report."""
    lowered = {k.lower(): v for k, v in headers.items()}
    values = [lowered.get(name, "") for name in _CREDENTIAL_HEADERS]
    values = [v.removeprefix("Bearer ").strip() for v in values]
    return [v for v in values if len(v) >= 8]


async def _http_error(response: HttpResponse, secrets: list[str]) -> ProviderHTTPError:
    try:
        body = await response.read_up_to(_MAX_ERROR_BODY)
    except TransportError:
        body = b""  # the status alone is enough to report
    message, code = _error_text(body)
    message = scrub(message, secrets)  # some providers echo the key back (OpenAI masks it)
    status = response.status
    reason = response.reason or f"HTTP {status}"
    retryable = is_retryable(status, code)
    return ProviderHTTPError(status, message or reason, retryable, code, response.headers)


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
