"""The provider request for a caller's request: forwarded (same dialect) or translated.

Same dialect as the provider: the body is forwarded with only ``model`` replaced (plus
``stream: true``, and for OpenAI ``stream_options.include_usage: true`` so usage is captured):
the codec's ``forwarded_body``; for a non-streaming caller, whose answer is folded from the
stream, the fields the folded answer cannot carry (``translation.FOLDED``: logprobs...) are
refused first, or dropped and listed with the opt-in. Another dialect: every field is
screened against the translation table first (a 400 naming the field and the route, or
dropped and listed with the opt-in), then the request goes through the neutral request to the
provider's dialect (:func:`translated`). Non-streaming callers are served from a
streamed provider call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, assert_never

import msgspec

from tokenwire.providers import Dialect
from tokenwire.services.gateway._dialects import (
    CallerCodec,
    NeutralRequest,
    R,
    neutral_to_anthropic,
    neutral_to_gemini,
    neutral_to_openai,
    neutral_to_responses,
    without_signatures,
)
from tokenwire.services.gateway._dialects.anthropic_messages import STRUCTURED_OUTPUTS_BETA
from tokenwire.services.gateway._dialects.translation import (
    DROPPED_HEADER,
    Screened,
    screen,
    screen_folded,
    wants_drop,
)
from tokenwire.services.gateway._routing.forward import forwarded_headers, merged
from tokenwire.services.gateway._routing.routing import Route


@dataclass(frozen=True)
class ProviderCall:
    """What goes to the provider (the route with the caller's forwarded headers, the body)
    and the headers the caller's answer carries (the dropped fields)."""

    route: Route
    body: bytes
    response_headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class CallerInput:
    """A caller's request as the gateway received it: its raw body, its headers, and the
    environment with the drop opt-in."""

    body: dict[str, Any]
    headers: Mapping[str, str]
    env: Mapping[str, str]
    default_max_tokens: int


def provider_call(codec: CallerCodec[R], req: R, route: Route, sent: CallerInput) -> ProviderCall:
    """The provider request for the parsed caller request ``req`` (see the module docstring)."""
    headers = forwarded_headers(sent.headers, route)
    name = f"{route.provider}/{route.model}"
    drop = wants_drop(sent.headers, sent.env, route.provider)
    if route.dialect == codec.dialect:
        routed = replace(route, headers={**route.headers, **headers})
        kept = Screened(sent.body, ())
        if not req.stream:
            kept = screen_folded(sent.body, codec.dialect, name, drop=drop)
        body = codec.forwarded_body(kept.body, route.model)
        return ProviderCall(routed, body, _dropped(kept))
    screened = screen(sent.body, codec.dialect, route.dialect, name, drop=drop)
    if screened.dropped:
        req = codec.parse(screened.body)
    body, needs = translated(codec.to_neutral(req), route, sent.default_max_tokens)
    routed = replace(route, headers={**route.headers, **merged(headers, needs)})
    return ProviderCall(routed, body, _dropped(screened))


def _dropped(screened: Screened) -> dict[str, str]:
    """The answer's header listing the dropped fields, if any were."""
    return {DROPPED_HEADER: ",".join(screened.dropped)} if screened.dropped else {}


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
