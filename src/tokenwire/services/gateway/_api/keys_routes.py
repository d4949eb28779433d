"""The operator's keys API: ``/v1/keys`` and ``/v1/tenants`` (docs/gateway.md, "Keys and
tenants"; ADR 0041).

- ``GET /v1/keys``: every key (never a hash: its first 8 hex digits) and tenant;
- ``POST /v1/keys`` (``{"name", "tenant", "scope", "expires_at", "models", "limits"}``):
  a new random key, answered once (201, ``{"key": "tw-...", "record": {...}}``);
- ``PATCH /v1/keys/{name}``: the fields given change (null: none; ``limits`` field by field);
- ``DELETE /v1/keys/{name}``: revoke it; every gateway refuses it within a second;
- ``PATCH /v1/tenants/{name}`` (``{"rpm", "tpm", "concurrent", "budget"}``) and
  ``DELETE /v1/tenants/{name}``: the limits a tenant's keys share.

Behind the gateway key, and only for an operator key (another is a 403); a keyless gateway
answers loopback only, as every route. Errors are OpenAI's shape; a gateway without a keys
bucket (no broker) or a broker that does not answer is a 503.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tokenwire.broker import BrokerError, KeyBook
from tokenwire.scrub import scrub
from tokenwire.services.gateway._access.key_admin import (
    KeyChanges,
    LimitChanges,
    NewKey,
    change_key,
    clear_tenant,
    create_key,
    key_view,
    listing,
    revoke_key,
    set_tenant,
)
from tokenwire.services.gateway._access.keys import ANONYMOUS, Caller
from tokenwire.services.gateway._dialects import OPENAI_CHAT
from tokenwire.services.gateway._errors import (
    BrokerUnavailableError,
    ForbiddenError,
    GatewayError,
    InvalidRequestError,
)

log = logging.getLogger("tokenwire.gateway")
S = TypeVar("S", bound=msgspec.Struct)
Handler = Callable[[Request, KeyBook], Awaitable[Response]]


def keys_routes(
    book: KeyBook | None, read_body: Callable[[Request], Awaitable[bytes]]
) -> list[Route]:
    """The routes above over ``book`` (None: each answers 503); ``read_body`` reads a body
    within the gateway's bound."""
    api = _KeysApi(read_body)

    def route(path: str, handler: Handler, method: str) -> Route:
        async def endpoint(request: Request) -> Response:
            try:
                _operator_only(request)
                if book is None:
                    raise BrokerUnavailableError("keys live in the broker: this gateway has none")
                return await handler(request, book)
            except BrokerError as exc:
                return _error(
                    BrokerUnavailableError("the keys bucket did not answer", detail=str(exc))
                )
            except GatewayError as exc:
                return _error(exc)

        return Route(path, endpoint, methods=[method])

    return [
        route("/v1/keys", api.list_keys, "GET"),
        route("/v1/keys", api.create, "POST"),
        route("/v1/keys/{name}", api.change, "PATCH"),
        route("/v1/keys/{name}", api.revoke, "DELETE"),
        route("/v1/tenants/{name}", api.tenant, "PATCH"),
        route("/v1/tenants/{name}", api.untenant, "DELETE"),
    ]


class _KeysApi:
    """The handlers, each over the request and the keys bucket."""

    def __init__(self, read_body: Callable[[Request], Awaitable[bytes]]) -> None:
        self._read_body = read_body

    async def _body(self, request: Request, kind: type[S]) -> S:
        try:
            return msgspec.json.decode(await self._read_body(request), type=kind)
        except msgspec.ValidationError as exc:
            raise InvalidRequestError(str(exc)) from None
        except msgspec.DecodeError:
            raise InvalidRequestError("the body is not a JSON object") from None

    async def list_keys(self, request: Request, book: KeyBook) -> Response:
        keys, tenants = await listing(book)
        tenant_views = [msgspec.to_builtins(t) for t in tenants]
        return JSONResponse({"keys": [key_view(k) for k in keys], "tenants": tenant_views})

    async def create(self, request: Request, book: KeyBook) -> Response:
        key, record = await create_key(book, await self._body(request, NewKey))
        return JSONResponse({"key": key, "record": key_view(record)}, status_code=201)

    async def change(self, request: Request, book: KeyBook) -> Response:
        name = request.path_params["name"]
        record = await change_key(book, name, await self._body(request, KeyChanges))
        return JSONResponse(key_view(record))

    async def revoke(self, request: Request, book: KeyBook) -> Response:
        name = request.path_params["name"]
        await revoke_key(book, name)
        return JSONResponse({"revoked": name})

    async def tenant(self, request: Request, book: KeyBook) -> Response:
        name = request.path_params["name"]
        record = await set_tenant(book, name, await self._body(request, LimitChanges))
        return JSONResponse(msgspec.to_builtins(record))

    async def untenant(self, request: Request, book: KeyBook) -> Response:
        name = request.path_params["name"]
        await clear_tenant(book, name)
        return JSONResponse({"cleared": name})


def _operator_only(request: Request) -> None:
    caller: Caller = getattr(request.state, "caller", ANONYMOUS)
    if not caller.operator:
        raise ForbiddenError("only an operator key may manage gateway keys")


def _error(exc: GatewayError) -> Response:
    if exc.detail:
        log.warning("keys API: %s (%s)", exc.message, exc.detail)
    body: Any = OPENAI_CHAT.error_body(exc)
    return Response(scrub(body.decode()), exc.status, media_type="application/json")
