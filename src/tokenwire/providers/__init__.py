"""Provider adapters: a provider's SSE stream in, tokenwire stream chunks out.

- :func:`get_provider` looks a provider up by its routing name (``openai``, ``deepseek``, ...)
  and says how to reach it and which :class:`Normaliser` reads its stream.
- A normaliser (:class:`OpenAIChatNormaliser`, :class:`OpenAIResponsesNormaliser`, ...) turns
  one response's :class:`~tokenwire.sse.SseEvent` s into chunks that obey the adapter contract.
- :func:`stream_chunks` does the HTTP part: send, parse, normalise, map failures
  (:func:`stream_batches`: the same, the chunks of each network read as one list), over
  :class:`HttpClient`, a small pooled HTTP/1.1 client (ADR 0009).

Example::

    spec = get_provider("deepseek")
    headers = {**spec.auth_headers(spec.api_key()), "content-type": "application/json"}
    request = ProviderRequest(spec.stream_url(), msgspec.json.encode(body), headers)
    async with ProviderSession() as session:
        async for chunk in stream_chunks(session, request, spec.normaliser()):
            ...

Exceptions: see ``_errors.py`` (``ProviderError`` and its leaves).
"""

from __future__ import annotations

from tokenwire.providers._anthropic import AnthropicNormaliser
from tokenwire.providers._base import Normaliser
from tokenwire.providers._body import normalise_body
from tokenwire.providers._errors import (
    ProviderConfigError,
    ProviderError,
    ProviderHTTPError,
    UnknownProviderError,
    is_retryable,
    relayed_headers,
)
from tokenwire.providers._gemini import (
    SIGNATURE_MARK,
    GeminiNormaliser,
    signed_call_id,
    split_call_id,
)
from tokenwire.providers._http import (
    READ_BUFFER,
    HttpClient,
    HttpResponse,
    Timeouts,
    TransportError,
    check_header,
    check_proxy,
    check_url,
)
from tokenwire.providers._openai_chat import OpenAIChatNormaliser
from tokenwire.providers._openai_responses import OpenAIResponsesNormaliser
from tokenwire.providers._registry import (
    AuthStyle,
    Dialect,
    ProviderSpec,
    get_provider,
    provider_names,
)
from tokenwire.providers._stream import (
    DEFAULT_TIMEOUTS,
    KEEPALIVE_S,
    ProviderRequest,
    ProviderSession,
    SentRequest,
    stream_batches,
    stream_chunks,
)

__all__ = [
    "DEFAULT_TIMEOUTS",
    "KEEPALIVE_S",
    "READ_BUFFER",
    "SIGNATURE_MARK",
    "AnthropicNormaliser",
    "AuthStyle",
    "Dialect",
    "GeminiNormaliser",
    "HttpClient",
    "HttpResponse",
    "Normaliser",
    "OpenAIChatNormaliser",
    "OpenAIResponsesNormaliser",
    "ProviderConfigError",
    "ProviderError",
    "ProviderHTTPError",
    "ProviderRequest",
    "ProviderSession",
    "ProviderSpec",
    "SentRequest",
    "Timeouts",
    "TransportError",
    "UnknownProviderError",
    "check_header",
    "check_proxy",
    "check_url",
    "get_provider",
    "is_retryable",
    "normalise_body",
    "provider_names",
    "relayed_headers",
    "signed_call_id",
    "split_call_id",
    "stream_batches",
    "stream_chunks",
]
