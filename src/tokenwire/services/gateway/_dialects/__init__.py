"""The gateway's dialect layer: everything one wire dialect means, one module per dialect.

- ``base.py``: the typed interface (:class:`CallerCodec`, :class:`StreamEncoder`,
  :class:`Forwarder`), :data:`CallerDialect` (the subset of
  :class:`~tokenwire.providers.Dialect` the endpoints speak) and what the dialects share;
- ``openai_chat.py``, ``anthropic_messages.py``, ``openai_responses.py``: a caller and
  provider dialect each: validation, to and from the neutral request, the stream encoder, the
  forwarder, the non-streaming body and the error body, and the :class:`CallerCodec`;
- ``gemini.py``: a provider dialect only (the neutral request to a Gemini body);
- ``neutral.py``: the neutral request every translation goes through;
- ``translation.py``: the table of each (caller, provider) pair's field fates.

Adding a dialect is one module here plus one :class:`~tokenwire.providers.Dialect` member;
mypy then names each ``match`` below (and in ``_routing.py``, ``_catalog.py``,
``translation.py``) that must handle it, since each ends in ``assert_never``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, assert_never

import msgspec

from tokenwire.providers import Dialect
from tokenwire.services.gateway._dialects.anthropic_messages import (
    STRUCTURED_OUTPUTS_BETA,
    AnthropicMessages,
    neutral_to_anthropic,
)
from tokenwire.services.gateway._dialects.base import (
    CallerCodec,
    CallerDialect,
    CallerRequest,
    Forwarder,
    R,
    Reply,
    StreamEncoder,
    frame,
    provider_reply,
)
from tokenwire.services.gateway._dialects.gemini import neutral_to_gemini
from tokenwire.services.gateway._dialects.neutral import NeutralRequest, without_signatures
from tokenwire.services.gateway._dialects.openai_chat import OpenAIChat, neutral_to_openai
from tokenwire.services.gateway._dialects.openai_responses import (
    OpenAIResponses,
    neutral_to_responses,
)

if TYPE_CHECKING:  # _routing imports this package (for CallerDialect): no cycle at run time
    from tokenwire.services.gateway._routing import Route

OPENAI_CHAT = OpenAIChat()
ANTHROPIC_MESSAGES = AnthropicMessages()
OPENAI_RESPONSES = OpenAIResponses()

_encode = msgspec.json.encode


def translated(
    neutral: NeutralRequest, route: Route, default_max_tokens: int
) -> tuple[bytes, dict[str, str]]:
    """The provider body for a request from another dialect, and the headers the provider's
    dialect needs for it (Anthropic's structured-outputs beta)."""
    body: dict[str, Any]
    needs: dict[str, str] = {}
    match route.dialect:
        case Dialect.OPENAI_CHAT:
            body = neutral_to_openai(
                without_signatures(neutral), route.model, legacy_max_tokens=route.legacy_max_tokens
            )
        case Dialect.ANTHROPIC_MESSAGES:
            body = neutral_to_anthropic(
                without_signatures(neutral), route.model, default_max_tokens=default_max_tokens
            )
            if neutral.output_format is not None:
                needs["anthropic-beta"] = STRUCTURED_OUTPUTS_BETA
        case Dialect.OPENAI_RESPONSES:
            body = neutral_to_responses(without_signatures(neutral), route.model)
        case Dialect.GEMINI:
            body = neutral_to_gemini(neutral)  # Gemini's own thought signatures go back to it
        case _:
            assert_never(route.dialect)
    return _encode(body), needs


__all__ = [
    "ANTHROPIC_MESSAGES",
    "OPENAI_CHAT",
    "OPENAI_RESPONSES",
    "AnthropicMessages",
    "CallerCodec",
    "CallerDialect",
    "CallerRequest",
    "Forwarder",
    "NeutralRequest",
    "OpenAIChat",
    "OpenAIResponses",
    "R",
    "Reply",
    "StreamEncoder",
    "frame",
    "neutral_to_anthropic",
    "neutral_to_gemini",
    "neutral_to_openai",
    "neutral_to_responses",
    "provider_reply",
    "translated",
    "without_signatures",
]
