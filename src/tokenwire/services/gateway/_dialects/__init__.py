"""The gateway's dialect layer: everything one wire dialect means, one module per dialect.

- ``base.py``: the typed interface (:class:`CallerCodec`, :class:`StreamEncoder`,
  :class:`Forwarder`), :data:`CallerDialect` (the subset of
  :class:`~tokenwire.providers.Dialect` the endpoints speak) and what the dialects share;
- ``openai_chat.py``, ``anthropic_messages.py``, ``openai_responses.py``: a caller and
  provider dialect each: validation, to and from the neutral request, the stream encoder, the
  forwarder, the non-streaming body and the error body, and the :class:`CallerCodec`;
- ``gemini.py``: a provider dialect only (the neutral request to a Gemini body);
- ``neutral.py``: the neutral request every translation goes through;
- ``translation.py``: the table of each (caller, provider) pair's field fates;
- ``validate.py``: a request body decoded once, into a typed request or a 400.

Adding a dialect is one module here plus one :class:`~tokenwire.providers.Dialect` member;
mypy then names each ``match`` that must handle it (in ``translation.py``,
``_routing/routing.py``, ``_routing/provider_call.py``, ``_api/catalog.py``), since each ends
in ``assert_never``.
"""

from __future__ import annotations

from tokenwire.services.gateway._dialects.anthropic_messages import (
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

OPENAI_CHAT = OpenAIChat()
ANTHROPIC_MESSAGES = AnthropicMessages()
OPENAI_RESPONSES = OpenAIResponses()

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
    "without_signatures",
]
