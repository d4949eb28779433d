"""Answers given before a route's handler runs: a route behind the gateway key
(:func:`require_key`), the 401 of the routes that speak OpenAI's shape, and an error in the
dialect of a path (:func:`dialect_error`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute
from starlette.routing import Route as HttpRoute

from tokenwire.services.gateway._access.keys import Caller
from tokenwire.services.gateway._dialects import ANTHROPIC_MESSAGES, OPENAI_CHAT
from tokenwire.services.gateway._errors import AuthenticationError, GatewayError


def dialect_error(path: str, exc: GatewayError) -> Response:
    """``exc`` answered before routing, in the path's dialect (Anthropic's under
    ``/v1/messages``, OpenAI's elsewhere)."""
    codec = ANTHROPIC_MESSAGES if path.startswith("/v1/messages") else OPENAI_CHAT
    headers = {"x-should-retry": "false"}
    return Response(codec.error_body(exc), exc.status, headers, media_type="application/json")


def require_key(authenticate: Callable[[Mapping[str, str]], Caller], route: BaseRoute) -> BaseRoute:
    """``route`` answering 401 (OpenAI-style error) without a valid gateway key, and with the
    caller in ``request.state.caller`` otherwise."""
    if not isinstance(route, HttpRoute) or route.path == "/viewer":
        return route
    endpoint = route.endpoint

    async def guarded(request: Request) -> Response:
        try:
            request.state.caller = authenticate(request.headers)
        except AuthenticationError as exc:
            return unauthorized(str(exc))
        response: Response = await endpoint(request)
        return response

    return HttpRoute(route.path, guarded, methods=route.methods, name=route.name)


def unauthorized(message: str) -> Response:
    """A 401 in OpenAI's shape (the session, usage, keys and metrics routes)."""
    return JSONResponse(
        {
            "error": {
                "message": message,
                "type": "authentication_error",
                "param": None,
                "code": "invalid_api_key",
            }
        },
        status_code=401,
        headers={"www-authenticate": "Bearer"},
    )
