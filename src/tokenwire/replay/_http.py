"""The HTTP routes a gateway mounts: session events (SSE), sessions, messages, the viewer.

``events_router(nc_provider, topology, store_provider)`` returns a starlette Router with
``GET /v1/sessions/{session}/events`` (SSE from the broker, :mod:`._sse`; resumable with
``Last-Event-ID`` or ``?from_seq``, down to a chunk inside a frame), ``GET /v1/sessions``
(summaries from the store), ``GET /v1/sessions/{session}/messages`` (stored outcomes),
``GET /v1/sessions/{session}/usage`` (ledger lines) and ``GET /viewer``. A caller that is not
an operator reads only its tenant's sessions; any other is exactly an unknown one (the same
404, after the same single lookup). Errors, bounds and scoping: docs/replay.md, "The session
events endpoint".
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from importlib import resources
from typing import Protocol

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response, StreamingResponse
from starlette.routing import Route, Router
from starlette.types import Receive, Scope, Send

from tokenwire.broker import BrokerError, Connection, Topology, session_owner, valid_session
from tokenwire.ledger import StepUsage, session_report
from tokenwire.replay._history import History
from tokenwire.replay._parents import stored_parents, with_parent
from tokenwire.replay._sse import NcProvider, SlowReaderPolicy, SseStats, stream
from tokenwire.schemas import json_encoder
from tokenwire.scrub import scrub
from tokenwire.store import Store, StoreError
from tokenwire.variables import GATEWAY_MAX_READERS

StoreProvider = Callable[[], Store]
"""Returns the store the routes read (raise if there is none yet)."""

MAX_SESSIONS_PAGE = 1000
MAX_OFFSET = 2**63 - 1
"""The stores' integer range (SQLite and PostgreSQL bigint): a larger offset is a 400, not the
driver's OverflowError (a 500, found by schemathesis)."""
MAX_SEQ = 2**64 - 1
"""JetStream's highest stream sequence (uint64): a resume id past it names no chunk that can
ever exist, so it is a 400, not a response that waits forever for nothing."""
MAX_INDEX = 2**32 - 1
"""The largest chunk index a resume position may name inside one message (a frame holds far
fewer: its payload is bounded by the broker's message size)."""
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DEFAULT_MAX_READERS = GATEWAY_MAX_READERS.value
"""Event responses open at once per app (each one broker read): see docs/gateway.md."""
READERS_RETRY_AFTER_S = 1

log = logging.getLogger("tokenwire.replay")


class Reader(Protocol):
    """Who reads (``request.state.caller``, the gateway's ``Caller``): an ``operator`` reads
    every session; any other reader only those of its ``tenant``."""

    @property
    def operator(self) -> bool: ...

    @property
    def tenant(self) -> str | None: ...


def read_scope(request: Request) -> str | None:
    """The tenant the request's reads are limited to, None when it reads every session (an
    operator, or no caller at all). A non-operator without a tenant reads nothing (``""``
    is no tenant's)."""
    caller: Reader | None = getattr(request.state, "caller", None)
    if caller is None or caller.operator:
        return None
    return caller.tenant or ""


class _BadRequestError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def events_router(
    nc_provider: NcProvider,
    topology: Topology,
    store_provider: StoreProvider,
    *,
    policy: SlowReaderPolicy | None = None,
    stats: SseStats | None = None,
    max_readers: int = DEFAULT_MAX_READERS,
) -> Router:
    """The replay routes, to include in an app: ``Starlette(routes=[..., *router.routes])``.

    ``policy`` bounds each SSE client (default :class:`SlowReaderPolicy`); ``stats`` (if given)
    counts clients, events, coalesced events, lagged and refused responses; ``max_readers``
    caps the event responses open at once (past it: 503 with ``retry-after``).
    """
    if max_readers < 1:
        raise ValueError(f"max_readers must be at least 1, got {max_readers}")
    routes = _Routes(
        nc_provider,
        topology,
        store_provider,
        policy or SlowReaderPolicy(),
        stats if stats is not None else SseStats(),
        max_readers,
    )
    return Router(
        routes=[
            Route("/v1/sessions", routes.sessions, methods=["GET"]),
            Route("/v1/sessions/{session}/events", routes.events, methods=["GET"]),
            Route("/v1/sessions/{session}/messages", routes.messages, methods=["GET"]),
            Route("/v1/sessions/{session}/usage", routes.usage, methods=["GET"]),
            Route("/viewer", routes.viewer, methods=["GET"]),
        ]
    )


class _Routes:
    def __init__(
        self,
        nc_provider: NcProvider,
        topology: Topology,
        store_provider: StoreProvider,
        policy: SlowReaderPolicy,
        stats: SseStats,
        max_readers: int,
    ) -> None:
        self._nc = nc_provider
        self._topology = topology
        self._store = store_provider
        self._policy = policy
        self._stats = stats
        self._max_readers = max_readers

    async def events(self, request: Request) -> Response:
        try:
            session = _session(request)
            start = _start(request)
            follow = _flag(request, "follow", default=True)
        except _BadRequestError as exc:
            return _error(400, "invalid_request_error", exc.message)
        try:
            nc = self._nc()
        except Exception as exc:
            return _unavailable("broker", exc)
        if self._stats.clients >= self._max_readers:
            return self._refused()
        # The slot is taken before the first await (the owner lookup): a burst of readers
        # can never all pass the check while each still waits for its lookup.
        slot = _ReaderSlot(self._stats)
        response: _CountedStream | None = None
        history = self._history(session)
        try:
            refusal = await self._refusal(request, nc, session, history)
            if refusal is not None:
                return refusal
            body = stream(
                nc,
                self._topology,
                session,
                start=start,
                follow=follow,
                policy=self._policy,
                stats=self._stats,
                history=history,
            )
            response = _CountedStream(body, slot)
            return response
        finally:
            if response is None:  # a 404, a 503, an error or a cancellation: given back
                slot.release()

    async def _refusal(
        self, request: Request, nc: Connection, session: str, history: History | None
    ) -> Response | None:
        """The answer for a reader that may not read ``session`` (None: it may). A tenant's
        reader asks the broker for the session's owner (the store's record for a session
        gone from the broker); an unknown session and another tenant's are the same 404."""
        scope = read_scope(request)
        if scope is None:
            return None
        try:
            tenant = await self._tenant(nc, session, history)
        except (BrokerError, StoreError) as exc:
            return _unavailable("broker", exc)
        if tenant != scope:
            return _not_found(session)
        return None

    def _history(self, session: str) -> History | None:
        """The store the steps gone from the broker are read from (none without a store)."""
        try:
            return History(self._store(), session)
        except Exception:  # no store yet: the broker alone, as before
            return None

    async def _tenant(self, nc: Connection, session: str, history: History | None) -> object:
        """Whose the session is: its first retained step's owner, else (gone from the broker)
        the store's record; ``False`` when neither knows it (no tenant's)."""
        owner = await session_owner(nc, self._topology, session)
        if owner is not None:
            return owner.tenant
        summary = await history.store.session(session) if history is not None else None
        return summary.tenant if summary is not None else False

    def _refused(self) -> Response:
        self._stats.refused += 1
        message = (
            f"the gateway serves at most {self._max_readers} session event streams at "
            "once; retry shortly"
        )
        response = _error(503, "overloaded", message)
        response.headers["retry-after"] = str(READERS_RETRY_AFTER_S)
        return response

    async def sessions(self, request: Request) -> Response:
        try:
            limit = _int_param(request, "limit", 100, 1, MAX_SESSIONS_PAGE)
            offset = _int_param(request, "offset", 0, 0, MAX_OFFSET)
        except _BadRequestError as exc:
            return _error(400, "invalid_request_error", exc.message)
        try:
            found = await self._store().sessions(
                limit=limit, offset=offset, tenant=read_scope(request)
            )
        except StoreError as exc:
            return _unavailable("store", exc)
        return _json({"sessions": found, "limit": limit, "offset": offset})

    async def messages(self, request: Request) -> Response:
        try:
            session = _session(request)
        except _BadRequestError as exc:
            return _error(400, "invalid_request_error", exc.message)
        try:
            found = await self._stored_messages(session, read_scope(request))
        except StoreError as exc:
            return _unavailable("store", exc)
        if not found:
            return _error(404, "not_found", f"session {session!r} has no stored messages")
        return _json({"session": session, "messages": found})

    async def _stored_messages(self, session: str, scope: str | None) -> list[object]:
        """The session's stored outcomes; none when it is not ``scope``'s (a tenant's reader
        looks the session up first, whether or not it exists: one query either way)."""
        store = self._store()
        if scope is not None and not await _owned(store, session, scope):
            return []
        outcomes = await store.messages(session)
        parents = await stored_parents(store, session, outcomes)
        return [with_parent(o, parents) for o in outcomes]

    async def usage(self, request: Request) -> Response:
        try:
            session = _session(request)
        except _BadRequestError as exc:
            return _error(400, "invalid_request_error", exc.message)
        try:
            lines = await self._stored_usage(session, read_scope(request))
        except StoreError as exc:
            return _unavailable("store", exc)
        if not lines:
            return _error(404, "not_found", f"session {session!r} has no usage lines")
        return _json(session_report(session, lines))

    async def _stored_usage(self, session: str, scope: str | None) -> list[StepUsage]:
        """The session's ledger lines; none when it is not ``scope``'s (looked up as for the
        messages: one query either way)."""
        store = self._store()
        if scope is not None and not await _owned(store, session, scope):
            return []
        return list(await store.session_usage(session))

    async def viewer(self, request: Request) -> Response:
        return HTMLResponse(viewer_html())


async def _owned(store: Store, session: str, scope: str) -> bool:
    """Whether the store records ``session`` as ``scope``'s (a tenant's reader asks before it
    reads, whether or not the session exists)."""
    summary = await store.session(session)
    return summary is not None and summary.tenant == scope


class _ReaderSlot:
    """One place under the reader cap, counted in ``stats.clients`` from its creation until
    :meth:`release` (idempotent): by the route when it answers anything but the stream, else
    by the stream's response when it ends."""

    def __init__(self, stats: SseStats) -> None:
        self._stats: SseStats | None = stats
        stats.clients += 1

    def release(self) -> None:
        if self._stats is not None:
            self._stats.clients -= 1
            self._stats = None


class _CountedStream(StreamingResponse):
    """An SSE response holding a reader slot until it ended, however it ends (caught up,
    lagged, the client gone, or never started): the reader cap's count."""

    def __init__(self, body: AsyncIterator[bytes], slot: _ReaderSlot) -> None:
        super().__init__(body, media_type="text/event-stream", headers=_SSE_HEADERS)
        self._slot = slot

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._slot.release()


def viewer_html() -> str:
    """The viewer page (static HTML and JS; no build step, nothing loaded from elsewhere)."""
    return resources.files("tokenwire.replay").joinpath("viewer.html").read_text("utf-8")


def _session(request: Request) -> str:
    session = str(request.path_params["session"])
    if not valid_session(session):
        raise _BadRequestError(
            f"invalid session id {session[:140]!r}: letters, digits, '-', '_' (1 to 128)"
        )
    return session


def _start(request: Request) -> tuple[int, int]:
    """The first position to send (stream seq, chunk index in that message): right after
    Last-Event-ID if present (the browser's reconnect), else ``?from_seq`` (inclusive), else
    the start. Both are checked when both are given (``N`` or ``N:I``, ADR 0024)."""
    raw = request.query_params.get("from_seq")
    start = (0, 0) if raw is None else _position("from_seq", raw, 1, MAX_SEQ)
    if start == (1, 0):  # the session's start: the store's part first, when there is one
        start = (0, 0)
    last = request.headers.get("last-event-id")
    if last is not None and last.strip():
        seq, index = _position("Last-Event-ID", last.strip(), 0, MAX_SEQ - 1)
        if ":" not in last:
            return (seq + 1, 0) if seq else (0, 0)  # the next message (0: from the start)
        return seq, index + 1  # inside a frame (or the store's part): its next chunk
    return start


def _position(name: str, raw: str, low: int, high: int) -> tuple[int, int]:
    """``N`` or ``N:I`` (a chunk inside a frame) with ``N`` in ``[low, high]``; ``0:K`` is
    the store's chunk ``K`` of a step gone from the broker (``_history.py``)."""
    seq_text, colon, index_text = raw.partition(":")
    seq = _parse_int(name, seq_text, 0 if colon else low, high)
    if not colon:
        return seq, 0
    return seq, _parse_int(f"{name}'s chunk index", index_text, 0, MAX_INDEX)


def _flag(request: Request, name: str, *, default: bool) -> bool:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if raw.lower() in ("true", "1", "yes"):
        return True
    if raw.lower() in ("false", "0", "no"):
        return False
    raise _BadRequestError(f"{name} must be true or false, got {raw[:40]!r}")


def _int_param(request: Request, name: str, default: int, low: int, high: int | None) -> int:
    raw = request.query_params.get(name)
    return default if raw is None else _parse_int(name, raw, low, high)


def _parse_int(name: str, raw: str, low: int, high: int | None) -> int:
    bound = f"{low}..{high}" if high is not None else f">= {low}"
    digits = raw.strip().lstrip("+-").lstrip("0")
    if high is not None and digits.isdigit() and len(digits) > len(str(high)):
        # Before int(): past 4300 digits it raises, which would read "not an integer".
        raise _BadRequestError(f"{name} must be {bound}, got {len(digits)} digits")
    try:
        value = int(raw)
    except ValueError:
        raise _BadRequestError(f"{name} must be an integer, got {raw[:40]!r}") from None
    if value < low or (high is not None and value > high):
        raise _BadRequestError(f"{name} must be {bound}, got {value}")
    return value


def _json(body: object, status: int = 200) -> Response:
    return Response(json_encoder.encode(body), status, media_type="application/json")


def _not_found(session: str) -> Response:
    """A session the reader may not read, or that no one wrote."""
    return _error(404, "not_found", f"session {session!r} not found")


def _unavailable(what: str, exc: Exception) -> Response:
    """503: the broker or the store is away. The reader is told which, never its words
    (they name where it lives, and a tenant's reader is an outsider); the log has them."""
    log.warning("session routes: %s not available: %s", what, exc)
    return _error(503, "unavailable", f"{what} not available")


def _error(status: int, kind: str, message: str) -> Response:
    return _json({"error": {"type": kind, "message": scrub(message)}}, status)
