"""One provider response over HTTP: bytes -> SseParser -> normaliser -> stream chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Final

import httpx
import msgspec

from tokenwire.providers._base import Normaliser
from tokenwire.providers._builder import step_error
from tokenwire.providers._errors import ProviderHTTPError, is_retryable
from tokenwire.schemas import Finish, StreamChunk
from tokenwire.sse import SseError, SseParser

__all__ = ["DEFAULT_TIMEOUT", "stream_chunks"]

DEFAULT_TIMEOUT: Final = httpx.Timeout(connect=10.0, read=120.0, write=30.0, pool=10.0)
"""Bounds for a client built for providers: ``read`` is the longest silence between bytes."""
_MAX_ERROR_BODY: Final = 64 * 1024  # an error body is read up to this many bytes
_CREDENTIAL_HEADERS: Final = ("authorization", "x-api-key", "api-key", "x-goog-api-key")


class _ErrorBody(msgspec.Struct):
    error: _ErrorObject | str | None = None
    message: str | None = None


class _ErrorObject(msgspec.Struct):
    message: str = ""
    code: str | int | None = None
    type: str | None = None


_error_body_decoder: Final = msgspec.json.Decoder(_ErrorBody | list[_ErrorBody])


async def stream_chunks(
    client: httpx.AsyncClient, request: httpx.Request, normaliser: Normaliser
) -> AsyncIterator[StreamChunk]:
    """Send ``request`` and yield its normalised chunks, ending with exactly one ``finish``.

    A non-2xx answer raises :class:`ProviderHTTPError` before any chunk (the provider's error
    text, never the request's headers). A transport failure or timeout after the stream began
    ends it with ``finish {error, retryable=True}`` after the chunks already yielded. Timeouts
    are the client's (build it with :data:`DEFAULT_TIMEOUT` or similar): the read timeout
    bounds every wait for the next bytes.
    """
    try:
        response = await client.send(request, stream=True)
    except httpx.TransportError as exc:
        yield _transport_finish(exc)
        return
    try:
        if not response.is_success:
            raise await _http_error(response, _secrets(request))
        async for chunk in _normalise(response, normaliser):
            yield chunk
    finally:
        await response.aclose()


async def _normalise(
    response: httpx.Response, normaliser: Normaliser
) -> AsyncIterator[StreamChunk]:
    parser = SseParser()
    try:
        async for data in response.aiter_bytes():
            for event in parser.feed(data):
                for chunk in normaliser.feed(event):
                    yield chunk
    except httpx.TransportError as exc:
        yield _transport_finish(exc)
        return
    except SseError as exc:
        yield Finish(reason="error", error=step_error(str(exc), False, "sse"))
        return
    for chunk in normaliser.close():
        yield chunk


def _transport_finish(exc: httpx.TransportError) -> Finish:
    kind = type(exc).__name__
    message = f"transport failure while streaming from the provider ({kind}): {exc}"
    return Finish(reason="error", error=step_error(message, True, kind))


def _secrets(request: httpx.Request) -> list[str]:
    """The credential values of the request, to scrub from anything we report."""
    values = [request.headers.get(name, "") for name in _CREDENTIAL_HEADERS]
    values = [v.removeprefix("Bearer ").strip() for v in values]
    return [v for v in values if len(v) >= 8]


async def _http_error(response: httpx.Response, secrets: list[str]) -> ProviderHTTPError:
    body = b""
    try:
        async for data in response.aiter_bytes():
            body += data
            if len(body) >= _MAX_ERROR_BODY:
                break
    except httpx.TransportError:
        pass  # the status alone is enough to report
    message, code = _error_text(body[:_MAX_ERROR_BODY])
    for secret in secrets:  # some providers echo the key back (OpenAI masks it, others may not)
        message = message.replace(secret, "[redacted]")
    status = response.status_code
    return ProviderHTTPError(
        status, message or response.reason_phrase, is_retryable(status, code), code
    )


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
