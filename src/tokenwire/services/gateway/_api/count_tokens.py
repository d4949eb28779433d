"""``POST /v1/messages/count_tokens``: Anthropic's token count, forwarded to Anthropic routes.

The body is Anthropic's (``model`` is ``provider/model``); it goes to the route's provider
with only ``model`` replaced, with the route's credential and the caller's allowlisted headers
(``anthropic-beta``), and the provider's answer comes back as it is (status, JSON body, its
``retry-after`` and rate-limit headers). A route of any other dialect has no such endpoint:
a 400 in Anthropic's error shape says so, naming the route. Nothing is published: counting is
not a model call.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from tokenwire.providers import Dialect, relayed_headers
from tokenwire.services.gateway._access.browsers import require_json
from tokenwire.services.gateway._dialects.anthropic_messages import anthropic_error_body
from tokenwire.services.gateway._dialects.validate import decode_object
from tokenwire.services.gateway._errors import GatewayError, InvalidRequestError, UpstreamError
from tokenwire.services.gateway._routing.forward import forwarded_headers
from tokenwire.services.gateway._routing.routing import resolve

TIMEOUT_S = 30.0
_JSON = "application/json"


class CountTokens:
    """The handler; ``authenticate`` and ``read_body`` are the gateway's own checks."""

    def __init__(
        self,
        env: Mapping[str, str],
        authenticate: Callable[[Mapping[str, str]], object],
        read_body: Callable[[Request], Awaitable[bytes]],
        secrets: tuple[str, ...],
    ) -> None:
        self._env = env
        self._authenticate = authenticate
        self._read_body = read_body
        self._secrets = secrets

    async def handle(self, request: Request) -> Response:
        """The endpoint."""
        try:
            return await self._count(request)
        except GatewayError as exc:
            headers = {"x-should-retry": "false"} if exc.status < 500 else {}
            body = anthropic_error_body(exc.message, _error_type(exc.status))
            return Response(body, exc.status, headers, media_type=_JSON)

    async def _count(self, request: Request) -> Response:
        self._authenticate(request.headers)
        require_json(request.headers)
        raw = decode_object(await self._read_body(request)).value
        model = raw.get("model")
        if not isinstance(model, str):
            raise InvalidRequestError("model: a string 'provider/model' is required", param="model")
        route = resolve(model, Dialect.ANTHROPIC_MESSAGES, self._env)
        if route.dialect != Dialect.ANTHROPIC_MESSAGES:
            raise InvalidRequestError(
                f"count_tokens is served only for Anthropic routes: {model} is a {route.dialect} "
                "route, which has no token-count endpoint",
                param="model",
            )
        headers = {**route.headers, **forwarded_headers(request.headers, route)}
        return await self._forward(
            route.url + "/count_tokens", {**raw, "model": route.model}, headers
        )

    async def _forward(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> Response:
        import httpx  # here, on the first count: the gateway's own upstream client is not httpx

        # As bytes: httpx encodes str values as ASCII, and a caller's latin-1 byte (which
        # HTTP allows, and the model endpoints forward as it came) was a 500 here.
        raw = {k.encode("latin-1"): v.encode("latin-1") for k, v in headers.items()}
        try:
            async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
                answer = await client.post(url, json=body, headers=raw)
        except httpx.HTTPError as exc:
            message = f"the provider's token count failed: {type(exc).__name__}"
            raise UpstreamError(message, upstream_status=None, retryable=True) from exc
        content = answer.content
        for secret in self._secrets:
            content = content.replace(secret.encode(), b"[redacted]")
        relayed = relayed_headers(answer.headers)
        if answer.status_code in (400, 404, 409, 413, 422):
            relayed["x-should-retry"] = "false"
        return Response(content, answer.status_code, relayed, media_type=_JSON)


def _error_type(status: int) -> str:
    return {401: "authentication_error", 404: "not_found_error", 413: "request_too_large"}.get(
        status, "invalid_request_error" if status < 500 else "api_error"
    )
