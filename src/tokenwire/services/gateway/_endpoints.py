"""The two caller dialects: how a request is read, forwarded or translated, and answered.

Same dialect as the provider: the body is forwarded with only ``model`` replaced (plus
``stream: true``, and for OpenAI ``stream_options.include_usage: true`` so usage is captured).
Another dialect: the request goes through the neutral request and the chunks through the
caller's stream encoder. Non-streaming callers are served from a streamed provider call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import msgspec

from tokenwire.schemas import Message
from tokenwire.services.gateway._caller_responses import (
    ResponsesRequest,
    responses_to_neutral,
    validate_responses,
)
from tokenwire.services.gateway._dialect_anthropic import (
    STRUCTURED_OUTPUTS_BETA,
    AnthropicRequest,
    anthropic_plain_ids,
    anthropic_to_neutral,
    neutral_to_anthropic,
    validate_anthropic,
)
from tokenwire.services.gateway._dialect_gemini import neutral_to_gemini
from tokenwire.services.gateway._dialect_openai import (
    OpenAIChatRequest,
    neutral_to_openai,
    openai_plain_ids,
    openai_to_neutral,
    validate_openai,
)
from tokenwire.services.gateway._dialect_responses import neutral_to_responses
from tokenwire.services.gateway._encode_anthropic import (
    AnthropicStreamEncoder,
    anthropic_error_body,
    anthropic_message,
)
from tokenwire.services.gateway._encode_openai import (
    OpenAIStreamEncoder,
    openai_completion,
    openai_error_body,
)
from tokenwire.services.gateway._encode_responses import ResponsesStreamEncoder, responses_object
from tokenwire.services.gateway._errors import GatewayError, TranslationUnsupportedError
from tokenwire.services.gateway._forward import forwarded_headers, merge_beta
from tokenwire.services.gateway._neutral import NeutralRequest, without_signatures
from tokenwire.services.gateway._output import CallerOutput, EncodingOutput, ForwardingOutput
from tokenwire.services.gateway._routing import CallerDialect, Route
from tokenwire.services.gateway._translation import DROPPED_HEADER, screen, wants_drop

_encode = msgspec.json.encode


@dataclass(frozen=True)
class Reply:
    """Ids and names of one response: ``response_id`` is ``chatcmpl-...`` or ``msg_...``."""

    response_id: str
    model: str
    created: int


@dataclass(frozen=True)
class ProviderCall:
    """What goes to the provider (the route with the caller's forwarded headers, the body)
    and the headers the caller's answer carries (the dropped fields)."""

    route: Route
    body: bytes
    response_headers: dict[str, str] = field(default_factory=dict)


def provider_reply(reply: Reply, response_id: str | None, model: str | None) -> Reply:
    """The reply named as the provider named its answer (its response id and model), where
    the provider sent them; the gateway's own id and the route otherwise."""
    return Reply(response_id or reply.response_id, model or reply.model, reply.created)


class Endpoint(Protocol):
    """One caller dialect."""

    dialect: CallerDialect

    def parse(
        self, body: dict[str, Any]
    ) -> OpenAIChatRequest | AnthropicRequest | ResponsesRequest: ...

    def provider_body(
        self, body: dict[str, Any], req: Any, route: Route, default_max_tokens: int
    ) -> bytes: ...

    def to_neutral(self, req: Any) -> NeutralRequest: ...

    def stream_output(self, req: Any, route: Route, reply: Reply) -> CallerOutput: ...

    def reply_id(self, raw_id: str) -> str: ...

    def message_body(self, message: Message, reply: Reply) -> bytes: ...

    def error_body(self, exc: GatewayError) -> bytes: ...


def provider_call(
    ep: Endpoint,
    body: dict[str, Any],
    req: Any,
    route: Route,
    caller_headers: Mapping[str, str],
    env: Mapping[str, str],
    default_max_tokens: int,
) -> ProviderCall:
    """The provider request for a parsed caller request.

    Same dialect: the body as sent (``provider_body``). Another dialect: every field is
    screened against the translation table first (a 400 naming the field and the route, or
    dropped and listed with the opt-in), then translated.
    """
    headers = forwarded_headers(caller_headers, route)
    if route.dialect == ep.dialect:
        routed = replace(route, headers={**route.headers, **headers})
        return ProviderCall(routed, ep.provider_body(body, req, route, default_max_tokens))
    name = f"{route.provider}/{route.model}"
    drop = wants_drop(caller_headers, env, route.provider)
    screened = screen(body, ep.dialect, route.dialect, name, drop=drop)
    if screened.dropped:
        req = ep.parse(screened.body)
    neutral = ep.to_neutral(req)
    if route.dialect == "anthropic-messages" and neutral.output_format is not None:
        headers["anthropic-beta"] = merge_beta(
            headers.get("anthropic-beta"), STRUCTURED_OUTPUTS_BETA
        )
    routed = replace(route, headers={**route.headers, **headers})
    answer = {DROPPED_HEADER: ",".join(screened.dropped)} if screened.dropped else {}
    return ProviderCall(routed, translated_body(neutral, route, default_max_tokens), answer)


def translated_body(neutral: NeutralRequest, route: Route, default_max_tokens: int) -> bytes:
    """The provider body for a request from another dialect; 400 if there is no translation."""
    if route.dialect != "gemini":
        neutral = without_signatures(neutral)
    if route.dialect == "openai-chat":
        body = neutral_to_openai(neutral, route.model, legacy_max_tokens=route.legacy_max_tokens)
    elif route.dialect == "anthropic-messages":
        body = neutral_to_anthropic(neutral, route.model, default_max_tokens=default_max_tokens)
    elif route.dialect == "openai-responses":
        body = neutral_to_responses(neutral, route.model)
    elif route.dialect == "gemini":
        body = neutral_to_gemini(neutral)
    else:
        raise TranslationUnsupportedError("the caller's dialect", route.dialect)
    return _encode(body)


class OpenAIEndpoint:
    """``POST /v1/chat/completions``."""

    dialect: CallerDialect = "openai-chat"

    def parse(self, body: dict[str, Any]) -> OpenAIChatRequest:
        return validate_openai(body)

    def to_neutral(self, req: OpenAIChatRequest) -> NeutralRequest:
        return openai_to_neutral(req)

    def provider_body(
        self, body: dict[str, Any], req: OpenAIChatRequest, route: Route, default_max_tokens: int
    ) -> bytes:
        if route.dialect != self.dialect:
            try:
                return translated_body(openai_to_neutral(req), route, default_max_tokens)
            except TranslationUnsupportedError as exc:
                raise TranslationUnsupportedError(self.dialect, exc.target) from None
        options = {**(body.get("stream_options") or {}), "include_usage": True}
        if (messages := openai_plain_ids(body.get("messages"))) is not body.get("messages"):
            body = {**body, "messages": messages}  # Gemini thought signatures left out
        return _encode({**body, "model": route.model, "stream": True, "stream_options": options})

    def stream_output(self, req: OpenAIChatRequest, route: Route, reply: Reply) -> CallerOutput:
        if route.dialect == self.dialect:
            return ForwardingOutput(self.dialect, strip_usage=not req.include_usage)
        encoder = OpenAIStreamEncoder(
            completion_id=reply.response_id, model=reply.model, created=reply.created,
            include_usage=req.include_usage,
        )  # fmt: skip
        return EncodingOutput(encoder)

    def reply_id(self, raw_id: str) -> str:
        return f"chatcmpl-{raw_id}"

    def message_body(self, message: Message, reply: Reply) -> bytes:
        return openai_completion(
            message, completion_id=reply.response_id, model=reply.model, created=reply.created
        )

    def error_body(self, exc: GatewayError) -> bytes:
        return openai_error_body(exc.message, _openai_type(exc), param=exc.param, code=exc.code)


def _openai_type(exc: GatewayError) -> str:
    return {401: "authentication_error", 404: "invalid_request_error", 429: "rate_limit_error"}.get(
        exc.status, "invalid_request_error" if exc.status < 500 else "api_error"
    )


class AnthropicEndpoint:
    """``POST /v1/messages``."""

    dialect: CallerDialect = "anthropic-messages"

    def parse(self, body: dict[str, Any]) -> AnthropicRequest:
        return validate_anthropic(body)

    def to_neutral(self, req: AnthropicRequest) -> NeutralRequest:
        return anthropic_to_neutral(req)

    def provider_body(
        self, body: dict[str, Any], req: AnthropicRequest, route: Route, default_max_tokens: int
    ) -> bytes:
        if route.dialect != self.dialect:
            try:
                return translated_body(anthropic_to_neutral(req), route, default_max_tokens)
            except TranslationUnsupportedError as exc:
                raise TranslationUnsupportedError(self.dialect, exc.target) from None
        if (messages := anthropic_plain_ids(body.get("messages"))) is not body.get("messages"):
            body = {**body, "messages": messages}  # Gemini thought signatures left out
        return _encode({**body, "model": route.model, "stream": True})

    def stream_output(self, req: AnthropicRequest, route: Route, reply: Reply) -> CallerOutput:
        if route.dialect == self.dialect:
            return ForwardingOutput(self.dialect, strip_usage=False)
        return EncodingOutput(
            AnthropicStreamEncoder(message_id=reply.response_id, model=reply.model)
        )

    def reply_id(self, raw_id: str) -> str:
        return f"msg_{raw_id}"

    def message_body(self, message: Message, reply: Reply) -> bytes:
        return anthropic_message(message, message_id=reply.response_id, model=reply.model)

    def error_body(self, exc: GatewayError) -> bytes:
        return anthropic_error_body(exc.message, _anthropic_type(exc.status))


def _anthropic_type(status: int) -> str:
    """Anthropic's error types by status (its documented table)."""
    return {
        401: "authentication_error",
        403: "permission_error",
        404: "not_found_error",
        413: "request_too_large",
        429: "rate_limit_error",
        503: "overloaded_error",
    }.get(status, "invalid_request_error" if status < 500 else "api_error")


class ResponsesEndpoint:
    """``POST /v1/responses``: the OpenAI Responses API (what the Agents SDK speaks)."""

    dialect: CallerDialect = "openai-responses"

    def parse(self, body: dict[str, Any]) -> ResponsesRequest:
        return validate_responses(body)

    def to_neutral(self, req: ResponsesRequest) -> NeutralRequest:
        return responses_to_neutral(req)

    def provider_body(
        self, body: dict[str, Any], req: ResponsesRequest, route: Route, default_max_tokens: int
    ) -> bytes:
        return _encode({**body, "model": route.model, "stream": True})

    def stream_output(self, req: ResponsesRequest, route: Route, reply: Reply) -> CallerOutput:
        if route.dialect == self.dialect:
            return ForwardingOutput(self.dialect, strip_usage=False)
        encoder = ResponsesStreamEncoder(
            response_id=reply.response_id, model=reply.model, created=reply.created
        )
        return EncodingOutput(encoder)

    def reply_id(self, raw_id: str) -> str:
        return f"resp_{raw_id}"

    def message_body(self, message: Message, reply: Reply) -> bytes:
        return responses_object(
            message, response_id=reply.response_id, model=reply.model, created=reply.created
        )

    def error_body(self, exc: GatewayError) -> bytes:
        return openai_error_body(exc.message, _openai_type(exc), param=exc.param, code=exc.code)
