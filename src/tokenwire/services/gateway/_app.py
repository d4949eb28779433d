"""The gateway's ASGI app: routes, request checks in order, and the step's HTTP response.

Order of checks (each failure is a 4xx in the endpoint's dialect; nothing is claimed or
published before the last one passed): gateway key, body size, JSON, field types, tokenwire
headers, model routing, translation; then the step is claimed (409 / 503) and run.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import random
from collections.abc import AsyncIterator, Mapping
from typing import Any

from opentelemetry import trace
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute
from starlette.routing import Route as HttpRoute

from tokenwire.broker import BrokerError
from tokenwire.schemas import RecordedError
from tokenwire.services.gateway._endpoints import (
    AnthropicEndpoint,
    Endpoint,
    OpenAIEndpoint,
    Reply,
)
from tokenwire.services.gateway._errors import (
    AuthenticationError,
    BodyTooLargeError,
    BrokerUnavailableError,
    GatewayError,
    InvalidRequestError,
    UpstreamError,
)
from tokenwire.services.gateway._identity import (
    RequestedIdentity,
    StepIdentity,
    assign_identity,
    read_identity,
)
from tokenwire.services.gateway._metrics import GatewayMetrics
from tokenwire.services.gateway._outbox import Outbox
from tokenwire.services.gateway._output import FoldingOutput
from tokenwire.services.gateway._routing import resolve, with_identity
from tokenwire.services.gateway._seams import GatewayDeps
from tokenwire.services.gateway._settings import GatewaySettings
from tokenwire.services.gateway._step import StepPlan, StepRun
from tokenwire.services.gateway._trace import start_step_span
from tokenwire.services.gateway._validate import decode_object

log = logging.getLogger("tokenwire.gateway")
_READY_TIMEOUT_S = 2.0
_OPENAI = OpenAIEndpoint()
_ANTHROPIC = AnthropicEndpoint()


class Gateway:
    """The request handlers of one app instance, with its metrics and running steps."""

    def __init__(self, settings: GatewaySettings, deps: GatewayDeps) -> None:
        self.settings = settings
        self.deps = deps
        self.metrics = GatewayMetrics(lambda: float(deps.sink.stats().in_flight))
        self._tasks: set[asyncio.Task[None]] = set()
        self._secrets = settings.secrets()
        self._rng = random.Random()

    # -- routes ---------------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        return await self._handle(request, _OPENAI)

    async def messages(self, request: Request) -> Response:
        """``POST /v1/messages``."""
        return await self._handle(request, _ANTHROPIC)

    async def healthz(self, request: Request) -> Response:
        """The process is up."""
        return self._count(request, JSONResponse({"status": "ok"}))

    async def readyz(self, request: Request) -> Response:
        """The broker is connected and the stream present."""
        try:
            async with asyncio.timeout(_READY_TIMEOUT_S):
                ready = await self.deps.ready()
        except (TimeoutError, BrokerError):
            ready = False
        body = {"status": "ready" if ready else "not ready"}
        return self._count(request, JSONResponse(body, status_code=200 if ready else 503))

    async def metrics_text(self, request: Request) -> Response:
        """Prometheus text exposition."""
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    # -- a model call ---------------------------------------------------------------------

    async def _handle(self, request: Request, ep: Endpoint) -> Response:
        received_ns = self.deps.clock_ns()
        try:
            response = await self._serve(request, ep, received_ns)
        except GatewayError as exc:
            response = self._error(ep, exc, None)
        return self._count(request, response)

    async def _serve(self, request: Request, ep: Endpoint, received_ns: int) -> Response:
        self.authenticate(request.headers)
        raw = decode_object(await self._read_body(request))
        req = ep.parse(raw)
        wanted = read_identity(request.headers)
        route = resolve(req.model, ep.dialect, self.settings.provider_env)
        body = ep.provider_body(raw, req, route, self.settings.default_max_tokens)
        identity = await self._identity(wanted, req.ends_with_tool_result)
        reply = Reply(ep.reply_id(self.deps.new_id()), req.model, received_ns // 1_000_000_000)
        span, trace_headers = start_step_span(request.headers, self._rng)
        route = with_identity(route, identity.headers())
        plan = StepPlan(identity, route, body, received_ns, trace_headers, self._secrets)
        try:
            if req.stream:
                return await self._stream(plan, ep.stream_output(req, route, reply), span)
            return await self._complete(plan, ep, reply, span)
        except GatewayError as exc:
            return self._error(ep, exc, identity)

    def authenticate(self, headers: Mapping[str, str]) -> None:
        """Raise AuthenticationError unless the headers carry a gateway key (when keys are set)."""
        if not self.settings.keys:
            return
        auth = headers.get("authorization", "")
        offered = auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get("x-api-key")
        if not offered or not any(
            hmac.compare_digest(offered.encode(), k.encode()) for k in self.settings.keys
        ):
            raise AuthenticationError("missing or invalid gateway API key")

    async def _read_body(self, request: Request) -> bytes:
        limit = self.settings.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise BodyTooLargeError(limit)
        body = bytearray()
        try:
            async for piece in request.stream():
                body += piece
                if len(body) > limit:
                    raise BodyTooLargeError(limit)
        except ClientDisconnect as exc:
            raise InvalidRequestError("the client disconnected while sending the body") from exc
        return bytes(body)

    async def _identity(self, wanted: RequestedIdentity, tool_result: bool) -> StepIdentity:
        try:
            return await assign_identity(
                wanted, self.deps.steps, self.deps.new_id,
                new_turn=not tool_result, conflict=self.deps.conflicts,
            )  # fmt: skip
        except BrokerError as exc:
            raise BrokerUnavailableError(f"the step registry is unavailable: {exc}") from exc

    def _start(
        self, plan: StepPlan, output: Any, span: trace.Span
    ) -> tuple[StepRun, asyncio.Task[None]]:
        outbox = Outbox(self.settings.caller_buffer_bytes)
        run = StepRun(plan, output, outbox, self.deps, self.metrics, self.settings.ack_timeout_s)
        task = asyncio.create_task(run.execute(), name=f"step {plan.identity}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: span.end())
        run.task = task
        return run, task

    async def _stream(self, plan: StepPlan, output: Any, span: trace.Span) -> Response:
        run, _ = self._start(plan, output, span)
        await asyncio.shield(run.started)  # raises the GatewayError that prevented the start
        headers = {**plan.identity.headers(), "cache-control": "no-cache"}
        return StreamingResponse(self._body(run), media_type="text/event-stream", headers=headers)

    async def _body(self, run: StepRun) -> AsyncIterator[bytes]:
        completed = False
        try:
            while (data := await run.outbox.get()) is not None:
                yield data
            completed = True
        finally:
            if not completed:
                self._caller_left(run)

    def _caller_left(self, run: StepRun) -> None:
        run.outbox.detach()
        if not self.settings.continue_on_disconnect and run.task is not None:
            run.task.cancel()

    async def _complete(
        self, plan: StepPlan, ep: Endpoint, reply: Reply, span: trace.Span
    ) -> Response:
        output = FoldingOutput()
        run, task = self._start(plan, output, span)
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            self._caller_left(run)
            raise
        await run.started
        if run.error is not None:
            raise run.error
        result = output.result()
        if isinstance(result, RecordedError):
            raise UpstreamError(result.message, upstream_status=None, retryable=result.retryable)
        headers = plan.identity.headers()
        return Response(
            ep.message_body(result, reply), media_type="application/json", headers=headers
        )

    # -- responses ------------------------------------------------------------------------

    def _error(self, ep: Endpoint, exc: GatewayError, identity: StepIdentity | None) -> Response:
        if exc.status >= 500:
            log.warning("step failed: %s", exc.message)
        headers = identity.headers() if identity is not None else {}
        if isinstance(exc, AuthenticationError):
            headers["www-authenticate"] = "Bearer"
        body = ep.error_body(exc)
        return Response(body, exc.status, headers, media_type="application/json")

    def _count(self, request: Request, response: Response) -> Response:
        self.metrics.requests.labels(request.url.path, str(response.status_code)).inc()
        return response

    async def drain(self, timeout_s: float) -> None:
        """Let running steps finish (bounded), then cancel the rest (they record ``aborted``)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
        for task in set(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _not_found(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 404
    message = exc.detail if isinstance(exc, HTTPException) else "not found"
    body = {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    }
    return JSONResponse(body, status_code=status)


def _require_key(gw: Gateway, route: BaseRoute) -> BaseRoute:
    """``route`` answering 401 (OpenAI-style error) without a valid gateway key."""
    if not isinstance(route, HttpRoute) or route.path == "/viewer":
        return route
    endpoint = route.endpoint

    async def guarded(request: Request) -> Response:
        try:
            gw.authenticate(request.headers)
        except AuthenticationError as exc:
            return JSONResponse(
                {"error": {"message": str(exc), "type": "authentication_error", "param": None,
                           "code": "invalid_api_key"}},
                status_code=401,
            )  # fmt: skip
        response: Response = await endpoint(request)
        return response

    return HttpRoute(route.path, guarded, methods=route.methods, name=route.name)


def create_app(settings: GatewaySettings, deps: GatewayDeps) -> Starlette:
    """The gateway as an ASGI app; the caller owns ``deps`` (connections, publisher).

    ``app.state.gateway`` is the :class:`Gateway` (metrics, running steps). On shutdown the
    app waits up to ``settings.ack_timeout_s`` for running steps.
    """
    gw = Gateway(settings, deps)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await gw.drain(settings.ack_timeout_s)

    routes = [
        HttpRoute("/v1/chat/completions", gw.chat_completions, methods=["POST"]),
        HttpRoute("/v1/messages", gw.messages, methods=["POST"]),
        # The session routes read recorded content: behind the same gateway keys as the model
        # endpoints (the viewer page itself holds no data and sends the key it is given).
        *(_require_key(gw, r) for r in deps.extra_routes),
        HttpRoute("/healthz", gw.healthz, methods=["GET"]),
        HttpRoute("/readyz", gw.readyz, methods=["GET"]),
        HttpRoute("/metrics", gw.metrics_text, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: _not_found}
    )
    app.state.gateway = gw
    return app
