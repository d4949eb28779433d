"""``GET /v1/usage``: tokens and cost from the store's usage ledger, scoped to the caller.

Query: ``by`` (model, provider, key, tenant, session, day; default model), ``since`` (a UTC
date ``YYYY-MM-DD`` or ``Nd``, the last N days), ``tenant`` (only that tenant's steps; ``""``:
the steps without one). The answer is the JSON of ``tokenwire usage --json``. A caller scoped
to a tenant reads only that tenant's lines: asking for another tenant answers no rows, the
same as a tenant without usage (nothing tells the two apart). Bad parameters are a 400 in
OpenAI's error shape; a store that does not answer is a 503.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, date, datetime

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tokenwire.ledger import InvalidUsageQuery, parse_since, usage_by, usage_report
from tokenwire.scrub import scrub
from tokenwire.services.gateway._access.keys import ANONYMOUS, Caller, visible_tenant
from tokenwire.store import Store, StoreError

StoreProvider = Callable[[], Store]

log = logging.getLogger("tokenwire.gateway")


def usage_scope(request: Request) -> str | None:
    """The tenant whose usage ``request`` may read; ``None``: every tenant's.

    The key check sets ``request.state.caller`` (``_keys.Caller``) on every authenticated
    request; without one (a gateway without keys, loopback only) the caller is
    :data:`ANONYMOUS`, an operator. An operator reads every tenant; any other caller reads its
    own tenant only (``""``, the steps without a tenant, when its key has none), never every
    tenant.
    """
    caller: Caller = getattr(request.state, "caller", ANONYMOUS)
    if caller.operator:
        return None
    return visible_tenant(caller) or ""


def usage_route(
    store: StoreProvider | None, today: Callable[[], date] = lambda: datetime.now(UTC).date()
) -> Route:
    """The ``GET /v1/usage`` route over the store ``store()`` returns (None: no store, 503)."""

    async def usage(request: Request) -> Response:
        params = request.query_params
        try:
            by = usage_by(params.get("by", "model"))
            raw_since = params.get("since")
            since = parse_since(raw_since, today()) if raw_since is not None else None
        except InvalidUsageQuery as exc:
            return _error(400, "invalid_request_error", str(exc), exc.field)
        wanted, scope = params.get("tenant"), usage_scope(request)
        if store is None:
            return _error(503, "unavailable", "this gateway has no store configured")
        if scope is not None and wanted not in (None, scope):
            return JSONResponse(usage_report(by, [], since, wanted))
        tenant = wanted if scope is None else scope
        try:
            groups = await store().usage(by, since, tenant)
        except StoreError as exc:  # its words name where it lives: for the log alone
            log.warning("usage: store not available: %s", exc)
            return _error(503, "unavailable", "store not available")
        return JSONResponse(usage_report(by, groups, since, tenant))

    return Route("/v1/usage", usage, methods=["GET"])


def _error(status: int, kind: str, message: str, param: str | None = None) -> Response:
    body = {"error": {"message": scrub(message), "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status_code=status)
