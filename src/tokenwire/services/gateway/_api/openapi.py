"""``GET /openapi.json``: an OpenAPI 3.1 description of the gateway's own surface.

The model endpoints take and return the bodies of the APIs they mirror (OpenAI Chat
Completions, Anthropic Messages), so their schemas point at those APIs rather than copying
them; what is the gateway's own (routing by ``provider/model``, the tokenwire headers, the
translation opt-in, the error shapes) is described here. A test checks that every route the
app serves is described.
"""

from __future__ import annotations

from typing import Any

from tokenwire.services.gateway._dialects.translation import DROP_HEADER, DROPPED_HEADER
from tokenwire.services.gateway._steps.coalesce import COALESCE_HEADER
from tokenwire.variables import MAX_COALESCE_MS

_OBJECT = {"type": "object", "additionalProperties": True}


def _header(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "in": "header",
        "required": False,
        "description": description,
        "schema": schema or {"type": "string"},
    }


_IDENTITY = [
    _header("x-tokenwire-session", "session id (letters, digits, - and _; 1-128); absent: new"),
    _header("x-tokenwire-turn", "explicit turn (with step)", {"type": "integer", "minimum": 0}),
    _header("x-tokenwire-step", "explicit step (with turn)", {"type": "integer", "minimum": 0}),
    _header(DROP_HEADER, "true: drop fields that cannot be translated (listed in the answer)"),
    _header("traceparent", "W3C trace context the step's span continues"),
    _header(
        COALESCE_HEADER,
        "wait in ms before each provider read past the first: later "
        "tokens arrive up to that much later, several per write (0: none)",
        {"type": "integer", "minimum": 0, "maximum": MAX_COALESCE_MS},
    ),
]
_ANSWER_HEADERS = {
    "x-tokenwire-session": {"schema": {"type": "string"}},
    "x-tokenwire-turn": {"schema": {"type": "integer"}},
    "x-tokenwire-step": {"schema": {"type": "integer"}},
    DROPPED_HEADER: {"schema": {"type": "string"}, "description": "fields dropped on opt-in"},
    COALESCE_HEADER: {"schema": {"type": "integer"}, "description": "the coalescing applied"},
}


def _error_answer(error: str) -> dict[str, Any]:
    """Every answer but the documented success: an error body in ``error``'s shape."""
    return {
        "description": f"an error in {error}'s shape",
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{error}Error"}}},
    }


def _model_call(summary: str, api: str, error: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "description": (
                f"The body of {api}; `model` is `provider/model`. Streaming answers are "
                "server-sent events in the same API's format."
            ),
            "parameters": _IDENTITY,
            "requestBody": {"required": True, "content": {"application/json": {"schema": _OBJECT}}},
            "responses": {
                "200": {
                    "description": f"{api} answer (JSON, or text/event-stream when streaming)",
                    "headers": _ANSWER_HEADERS,
                    "content": {"application/json": {"schema": _OBJECT}, "text/event-stream": {}},
                },
                "default": _error_answer(error),
            },
        }
    }


_SESSION = {
    "name": "session",
    "in": "path",
    "required": True,
    "description": "session id (letters, digits, - and _; 1-128); others answer 400",
    "schema": {"type": "string"},
}


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


_PAGE = [
    _query("limit", "sessions per page (1-1000, default 100)", {"type": "integer"}),
    _query("offset", "sessions to skip (default 0)", {"type": "integer"}),
]
_RETRIEVE = [
    {
        "name": "response_id",
        "in": "path",
        "required": True,
        "description": 'a Responses answer\'s id (docs/gateway.md, "Resuming a step")',
        "schema": {"type": "string"},
    },
    _query("stream", "true: the events again, then live (default false)", {"type": "boolean"}),
    _query(
        "starting_after",
        "stream from the event after this sequence_number",
        {"type": "integer", "minimum": 0},
    ),
]
_EVENTS = [
    _query("from_seq", "first stream sequence (else `Last-Event-ID` + 1)", {"type": "integer"}),
    _query("follow", "false: end once caught up (default true)", {"type": "boolean"}),
]
_USAGE = [
    _query(
        "by",
        "model (default), provider, key, tenant, session or day",
        {"type": "string", "enum": ["model", "provider", "key", "tenant", "session", "day"]},
    ),
    _query(
        "since", "first UTC day counted: YYYY-MM-DD, or Nd (the last N days)", {"type": "string"}
    ),
    _query("tenant", "only this tenant's steps ('' for those without one)", {"type": "string"}),
]


def _get(
    summary: str,
    content: str = "application/json",
    *,
    public: bool = False,
    session: bool = False,
    query: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A ``GET`` route; ``public``: served without a gateway key; ``session``: under
    ``/v1/sessions/{session}``. Its errors have OpenAI's shape (the gateway's default)."""
    get: dict[str, Any] = {
        "summary": summary,
        "responses": {
            "200": {"description": summary, "content": {content: {}}},
            "default": _error_answer("OpenAI"),
        },
    }
    if public:
        get["security"] = []
    parameters = ([_SESSION] if session else []) + (query or [])
    if parameters:
        get["parameters"] = parameters
    return {"get": get}


def openapi_document(version: str) -> dict[str, Any]:
    """The gateway's OpenAPI document."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "tokenwire gateway",
            "version": version,
            "description": "A drop-in for the OpenAI and Anthropic APIs that records every "
            "token stream durably (docs/gateway.md).",
        },
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
            "schemas": {
                "OpenAIError": {
                    "type": "object",
                    "properties": {
                        "error": {
                            "type": "object",
                            "properties": {
                                "message": {"type": "string"},
                                "type": {"type": "string"},
                                "param": {"type": ["string", "null"]},
                                "code": {"type": ["string", "null"]},
                            },
                        }
                    },
                },
                "AnthropicError": {
                    "type": "object",
                    "properties": {
                        "type": {"const": "error"},
                        "error": {
                            "type": "object",
                            "properties": {
                                "type": {"type": "string"},
                                "message": {"type": "string"},
                            },
                        },
                    },
                },
            },
        },
        "security": [{"bearer": []}, {"apiKey": []}],
        "paths": {
            "/v1/chat/completions": _model_call(
                "OpenAI Chat Completions", "OpenAI's Chat Completions API", "OpenAI"
            ),
            "/v1/responses": _model_call("OpenAI Responses", "OpenAI's Responses API", "OpenAI"),
            "/v1/responses/{response_id}": _get(
                "a Responses answer again, from the broker (folded, or streamed with "
                "`stream=true`)",
                query=_RETRIEVE,
            ),
            "/v1/messages": _model_call(
                "Anthropic Messages", "Anthropic's Messages API", "Anthropic"
            ),
            "/v1/messages/count_tokens": {
                "post": {
                    "summary": "Anthropic token count (Anthropic routes; 400 elsewhere)",
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": _OBJECT}},
                    },
                    "responses": {
                        "200": {
                            "description": "`{input_tokens}`",
                            "content": {"application/json": {}},
                        },
                        "default": _error_answer("Anthropic"),
                    },
                }
            },
            "/v1/models": _get(
                "the configured providers' models as `provider/model` (OpenAI list)"
            ),
            "/openapi.json": _get("this document", public=True),
            "/healthz": _get("200 while the process runs", public=True),
            "/readyz": _get(
                "200 when the gateway can capture steps, else 503 with the reasons "
                "(docs/gateway.md, Readiness)",
                public=True,
            ),
            "/metrics": _get("Prometheus text exposition", "text/plain", public=True),
            "/v1/sessions": _get("recorded sessions (docs/replay.md)", query=_PAGE),
            "/v1/sessions/{session}/events": _get(
                "a session's recorded events (docs/replay.md)",
                "text/event-stream",
                session=True,
                query=_EVENTS,
            ),
            "/v1/sessions/{session}/messages": _get(
                "a session's messages (docs/replay.md)", session=True
            ),
            "/v1/sessions/{session}/usage": _get(
                "a session's steps with their tokens and cost (docs/ledger.md)", session=True
            ),
            "/v1/usage": _get(
                "tokens and cost from the usage ledger, grouped (docs/ledger.md)", query=_USAGE
            ),
            "/viewer": _get("the session viewer page", "text/html", public=True),
        },
    }
