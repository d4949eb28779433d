"""The gateway's ASGI app: routes, request checks in order, and the step's HTTP response.

Order of checks (each failure is a 4xx in the endpoint's dialect; nothing is claimed or
published before the last one passed): without keys, a loopback ``Host`` and no other site's
``Origin`` (``_access/browsers.py``, before routing, on every route); gateway key, a JSON
content type, body size, JSON (no name repeated), field types and ranges, tokenwire headers,
model routing, translation, the named session's tenant (``_access/owners.py``); then the step
is claimed (409 / 503) and run. Requests are counted by route template (:meth:`Gateway.count`).

Every authenticated request carries its :class:`~._keys.Caller` as ``request.state.caller``
(the session routes and ``GET /v1/usage`` scope their reads by it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib.metadata
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute
from starlette.routing import Route as HttpRoute
from starlette.types import Receive, Scope, Send

from tokenwire.broker import BrokerError, MemoryAllowances, StepNames, cancel_task
from tokenwire.config import ConfigError
from tokenwire.providers import Dialect
from tokenwire.schemas import RecordedError
from tokenwire.scrub import register, scrub
from tokenwire.services.gateway._access.browsers import keyless_refusal, require_json
from tokenwire.services.gateway._access.identity import (
    SESSION_HEADER,
    RequestedIdentity,
    ResumeTarget,
    StepClaim,
    StepIdentity,
    read_identity,
)
from tokenwire.services.gateway._access.keys import (
    ANONYMOUS,
    KEYS_FILE_VAR,
    Caller,
    KeyRing,
    may_use,
    offered_key,
)
from tokenwire.services.gateway._access.live_keys import LiveKeys
from tokenwire.services.gateway._access.owners import SessionGuard
from tokenwire.services.gateway._access.threads import (
    PARENT_HEADER,
    StepThread,
    ThreadRequest,
    thread_request,
)
from tokenwire.services.gateway._api.catalog import ModelCatalog
from tokenwire.services.gateway._api.claiming import step_claim
from tokenwire.services.gateway._api.count_tokens import CountTokens
from tokenwire.services.gateway._api.edge import header_map
from tokenwire.services.gateway._api.error_headers import error_headers
from tokenwire.services.gateway._api.guards import dialect_error, require_key, unauthorized
from tokenwire.services.gateway._api.keys_routes import keys_routes
from tokenwire.services.gateway._api.openapi import openapi_document
from tokenwire.services.gateway._api.planned import (
    CheckedCall,
    naming_for,
    reply_for,
    routed_step,
    served_headers,
)
from tokenwire.services.gateway._api.retrieve import (
    NoSuchResponseError,
    retrieve_request,
    retrieve_target,
)
from tokenwire.services.gateway._api.routed import RoutesDesk, Routing
from tokenwire.services.gateway._api.settings import GatewaySettings, check_provider_env
from tokenwire.services.gateway._api.usage import usage_route
from tokenwire.services.gateway._dialects import (
    ANTHROPIC_MESSAGES,
    OPENAI_CHAT,
    OPENAI_RESPONSES,
    CallerCodec,
    R,
    Reply,
    provider_reply,
)
from tokenwire.services.gateway._dialects.validate import decode_object
from tokenwire.services.gateway._errors import (
    AuthenticationError,
    BodyTooLargeError,
    BrokerUnavailableError,
    GatewayError,
    InvalidRequestError,
    ModelNotAllowedError,
    SessionNotFoundError,
    UpstreamError,
)
from tokenwire.services.gateway._limits.calls import Target, admit_call, settler
from tokenwire.services.gateway._limits.limiter import Admission, Limiter
from tokenwire.services.gateway._observe.genai import GenAICalls, call_span_attributes
from tokenwire.services.gateway._observe.metrics import GatewayMetrics
from tokenwire.services.gateway._observe.ready import Readiness
from tokenwire.services.gateway._observe.trace import start_step_span
from tokenwire.services.gateway._output.caller import (
    CallerOutput,
    FoldingOutput,
    HeadTap,
    stream_output,
)
from tokenwire.services.gateway._output.scrubbed import scrubbed
from tokenwire.services.gateway._resume.resume import ResumeBounds, Resumer, fingerprint
from tokenwire.services.gateway._routing.provider_call import (
    CallerInput,
    ProviderCall,
    provider_call,
)
from tokenwire.services.gateway._routing.routing import Route, with_identity
from tokenwire.services.gateway._routing.upstream import UpstreamCall
from tokenwire.services.gateway._steps.coalesce import answered, coalesce_ms
from tokenwire.services.gateway._steps.deps import GatewayDeps
from tokenwire.services.gateway._steps.fallback import RoutedStep
from tokenwire.services.gateway._steps.step import StepRun
from tokenwire.services.gateway._steps.step_plan import StepPlan

log = logging.getLogger("tokenwire.gateway")
_READY_TIMEOUT_S = 2.0


class Gateway:
    """The request handlers of one app instance, with its metrics and running steps."""

    def __init__(self, settings: GatewaySettings, deps: GatewayDeps) -> None:
        self.settings = settings
        self.deps = deps
        self.keys = self._checked(settings.key_ring())
        self.guard = SessionGuard(deps.owners, active=self.keys.tenants, monotonic=deps.monotonic)
        keyed = bool(self.keys) or not settings.loopback_only
        self.live_keys = LiveKeys(
            settings.key_bootstrap(), deps.keys, apply=self.use_keys, keyed=keyed
        )
        self.metrics = GatewayMetrics(lambda: float(deps.sink.stats().in_flight))
        self._tasks: set[asyncio.Task[None]] = set()
        self.drain_deadline: float | None = None
        """When set (``time.monotonic``), the stop's drain ends by then: the stop bound's."""
        self._secrets = settings.secrets()
        register(*self._secrets)  # scrubbed from every error and log line of the process
        self._rng = random.Random()
        self.calls = GenAICalls(self.metrics, deps.otel)
        self.resumer = _resumer(settings, deps)
        self.routes = RoutesDesk(
            settings, deps, self.metrics, rng=self._rng, on_reload=self._scrub_too
        )
        self.limiter = Limiter(
            deps.allowances or MemoryAllowances(),
            clock_ns=deps.limits_clock_ns,
            hold_ttl_s=settings.limits_hold_ttl_s,
            on_refusal=self.metrics.limit_refused,
            on_trip=self.metrics.limit_trip,
        )

    def _scrub_too(self, secrets: tuple[str, ...]) -> None:
        """A reloaded routes file's credentials are scrubbed from what callers receive too."""
        added = (x for x in secrets if len(x) >= 4)
        self._secrets = tuple(dict.fromkeys((*self._secrets, *added)))

    @property
    def running_steps(self) -> int:
        """Steps streaming now."""
        return len(self._tasks)

    def _checked(self, ring: KeyRing) -> KeyRing:
        if ring.tenants and self.deps.owners is None:
            why = "the gateway needs the broker's session owners (deps.owners)"
            raise ConfigError(KEYS_FILE_VAR, "[keys with tenants]", why)
        return ring

    def use_keys(self, ring: KeyRing) -> None:
        """Accept ``ring``'s keys from the next request on (the keys bucket changed, or the
        keys file reloaded on ``SIGHUP``). Requests already authenticated keep their caller.
        ConfigError (nothing changed) for tenant keys on a gateway without session owners."""
        self.keys = self._checked(ring)
        self.guard.check_tenants(ring.tenants)

    # -- routes ---------------------------------------------------------------------------

    async def chat_completions(self, request: Request) -> Response:
        """``POST /v1/chat/completions``."""
        return await self._handle(request, OPENAI_CHAT, "/v1/chat/completions")

    async def messages(self, request: Request) -> Response:
        """``POST /v1/messages``."""
        return await self._handle(request, ANTHROPIC_MESSAGES, "/v1/messages")

    async def responses(self, request: Request) -> Response:
        """``POST /v1/responses``."""
        return await self._handle(request, OPENAI_RESPONSES, "/v1/responses")

    async def retrieve(self, request: Request) -> Response:
        """``GET /v1/responses/{response_id}`` (``_api/retrieve.py``)."""
        try:
            req, after = retrieve_request(request)
            response_id = request.path_params["response_id"]
            target, owner_of = await retrieve_target(self.deps.steps, response_id)
            # An unknown id asks for the owner of a session no step has: another tenant's id
            # and an unknown one cost the same reads and answer the same 404.
            allowed = await self.guard.may_read(request.state.caller, owner_of)
            if target is None or not allowed:
                raise NoSuchResponseError(response_id)
        except GatewayError as exc:
            return self._error(OPENAI_RESPONSES, exc, None)
        return await self._resume(OPENAI_RESPONSES, req, target, after)

    async def healthz(self, request: Request) -> Response:
        """The process is up and can serve: 503 once the broker connection is closed for good
        (reconnecting is not closed: ``/readyz`` covers that)."""
        if not self.deps.live():
            return JSONResponse({"status": "broker connection closed"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        """200 when the gateway can capture steps, else 503 with the reasons
        (``_observe/ready.py``)."""
        readiness = await self._readiness()
        status = 200 if readiness.ready else 503
        return JSONResponse(readiness.body(), status_code=status)

    async def _readiness(self) -> Readiness:
        """Ask (bounded by ``_READY_TIMEOUT_S``) and export the answer as gauges."""
        try:
            async with asyncio.timeout(_READY_TIMEOUT_S):
                readiness = await self.deps.ready()
        except (TimeoutError, BrokerError) as exc:
            readiness = Readiness(("broker",), f"broker: no answer ({type(exc).__name__})")
        stale = self.live_keys.stale()
        if stale is not None:
            readiness = readiness.adding("keys-stale", stale)
        self.metrics.readiness(readiness.reasons)
        return readiness

    async def metrics_text(self, request: Request) -> Response:
        """Prometheus text exposition (the readiness gauges asked afresh); with
        ``metrics_key`` set, only for a request carrying it (``Authorization: Bearer KEY``,
        what Prometheus's ``authorization`` sends)."""
        wanted = self.settings.metrics_key
        if wanted is not None:
            offered = offered_key(header_map(request.scope)) or ""
            if not hmac.compare_digest(offered.encode(), wanted.encode()):
                return unauthorized("missing or invalid metrics key")
        await self._readiness()
        return Response(self.metrics.render(), media_type="text/plain; version=0.0.4")

    # -- a model call ---------------------------------------------------------------------

    async def _handle(self, request: Request, codec: CallerCodec[R], route: str) -> Response:
        received_ns = self.deps.clock_ns()
        try:
            response = await self._serve(request, codec, received_ns)
        except GatewayError as exc:
            response = self._error(codec, exc, None)
        return self.count(route, response)

    async def _serve(self, request: Request, codec: CallerCodec[R], received_ns: int) -> Response:
        """Check the request, plan the step, start it, and return its answer."""
        settings, headers = self.settings, header_map(request.scope)
        caller = request.state.caller = self.authenticate(headers)
        require_json(headers)
        body = decode_object(await self._read_body(request))
        raw = body.value
        req = codec.parse(raw)
        if not may_use(caller, req.model):
            raise ModelNotAllowedError(key=caller.name, model=req.model)
        wanted = read_identity(headers)
        coalesce = coalesce_ms(headers, settings.coalesce_ms)
        sent = CallerInput(raw, headers, settings.provider_env, settings.default_max_tokens)
        routing = await self.routes.routing(req.model, codec.dialect)
        admission: Admission | None = None
        try:
            call = await self.routes.first_call(
                req.model,
                codec.dialect,
                routing,
                lambda route: provider_call(codec, req, route, sent),
            )
            admission = await admit_call(
                self.limiter,
                caller,
                body=raw,
                body_bytes=len(body.canonical),
                targets=_targets(call.route, routing),
                default_cap=settings.budget_default_max_tokens,
                at_ns=received_ns,
            )
            threaded, thread = await self._thread(caller, codec, req, raw, wanted, headers)
            session = wanted.session or threaded or self.deps.new_id()
            await self.guard.admit(caller, session, named=wanted.session is not None)
            claim = await step_claim(
                self.deps.steps,
                wanted=wanted,
                session=session,
                req=req,
                fp=lambda: fingerprint(request.scope["path"], body.canonical),
                headers=headers,
                fresh=threaded is None,
                idempotency_ttl_s=settings.idempotency_ttl_s,
            )
        except BaseException:
            self.routes.unsent(routing)
            if admission is not None:
                admission.release()
            raise
        if isinstance(claim, ResumeTarget):
            self.routes.unsent(routing)
            if admission is not None:
                admission.release()
            return _with(call.response_headers, await self._resume(codec, req, claim))
        r = CheckedCall(
            request=request,
            codec=codec,
            req=req,
            sent=sent,
            headers=headers,
            caller=caller,
            session=session,
            received_ns=received_ns,
            coalesce=coalesce,
            thread=thread,
            admission=admission,
        )
        return await self._run_step(r, call, claim, routing)

    async def _run_step(
        self, r: CheckedCall[R], call: ProviderCall, claim: StepClaim, routing: Routing | None
    ) -> Response:
        """Send the provider call, set the step up while the provider works, start it, and
        return its answer (streamed, or folded once it ended)."""
        # The provider is called before the step is set up (span, output, run): it works
        # while they are built (see docs/gateway-internals.md, "Performance").
        call_start_ns = self.deps.clock_ns()
        routed = with_identity(call.route, {SESSION_HEADER: r.session})
        upstream = self.deps.upstream.send(routed, call.body)
        try:
            await claim.send()  # an assigned step's claim: beside the provider, from here
            reply, known = await reply_for(r, claim, self.deps.new_id)
            output = self._output(r.codec, r.req, routed, reply)
            forwarded = routed.dialect == r.codec.dialect
            attempts = routed_step(
                routing,
                r,
                first=(routed, upstream, output, call),
                upstream=self.deps.upstream,
                output=lambda route: self._output(r.codec, r.req, route, reply),
                health=self.routes.health,
                metrics=self.metrics,
            )
            run = self._step_run(
                r=r,
                route=routed,
                upstream=upstream,
                output=output,
                claim=claim,
                call_start_ns=call_start_ns,
                naming=naming_for(reply, r.req.stream) if known is not None else None,
                forwarded=forwarded,
                routing=attempts,
            )
        except BaseException:
            upstream.cancel()
            claim.drop()
            self.routes.unsent(routing)
            if r.admission is not None:
                r.admission.release()
            raise
        try:
            await run.start()
        except GatewayError as exc:
            error = self._error(r.codec, exc, run.identity)
            return _with(
                {**served_headers(call, attempts), **r.thread.headers(run.identity)}, error
            )
        headers = {
            **served_headers(call, attempts),
            **answered(r.coalesce),
            **r.thread.headers(run.identity),
        }
        if not r.req.stream:
            folded = await self._folded(run, r.codec, reply, forwarded=run.forwarded)
            return _with(headers, folded)
        return _with(headers, run.response())

    def _output(self, codec: CallerCodec[R], req: R, route: Route, reply: Reply) -> CallerOutput:
        """What the caller receives: the stream in its dialect, or the folded answer."""
        if not req.stream:
            return FoldingOutput()
        same_dialect = route.dialect == codec.dialect
        return scrubbed(stream_output(codec, req, same_dialect, reply), self._secrets)

    def _step_run(
        self,
        *,
        r: CheckedCall[R],
        route: Route,
        upstream: UpstreamCall,
        output: CallerOutput,
        claim: StepClaim,
        call_start_ns: int,
        naming: Callable[[HeadTap | None, bool], StepNames] | None,
        forwarded: bool,
        routing: RoutedStep | None,
    ) -> StepRun:
        """The planned step over its sent provider call, with its call span started (its
        trace headers go on the step's first chunk)."""
        settings, session = self.settings, r.session
        span, trace_headers = start_step_span(
            r.headers,
            self._rng,
            tracer=self.calls.tracer,
            recording=self.calls.recording,
            name=f"chat {route.model}",
            attributes=call_span_attributes(route, session) if self.calls.recording else {},
            start_ns=call_start_ns,
        )
        observer = self.calls.observe(route, session, span, call_start_ns)
        aliased = r.request.scope["path"] == "/v1/responses"  # GET /v1/responses/{id}
        forwarded_stream = route.dialect is Dialect.OPENAI_RESPONSES and not isinstance(
            output, FoldingOutput
        )
        plan = StepPlan(
            session=session,
            claim=claim,
            route=route,
            call=upstream,
            request_time_ns=r.received_ns,
            trace_headers=trace_headers,
            secrets=self._secrets,
            continue_on_disconnect=settings.continue_on_disconnect,
            caller=r.caller,
            naming=naming,
            aliased=aliased,
            # a forwarded stream's first bytes carry the provider's id: mapped before them
            names_before_bytes=aliased and naming is not None and forwarded_stream,
            coalesce_s=r.coalesce / 1000,
            thread=r.thread,
            on_end=settler(r.admission, r.received_ns),
            forwarded=forwarded,
            routing=routing,
        )
        return StepRun(
            plan=plan,
            output=output,
            caller_buffer_bytes=settings.caller_buffer_bytes,
            deps=self.deps,
            metrics=self.metrics,
            ack_timeout_s=settings.ack_timeout_s,
            bounds=settings.step_bounds,
            call=observer,
            running=self._tasks,
            framing=settings.framing,
        )

    def authenticate(self, headers: Mapping[str, str]) -> Caller:
        """The caller whose gateway key the headers carry (:data:`ANONYMOUS` without keys);
        AuthenticationError when they carry none the gateway accepts."""
        if not self.keys:
            return ANONYMOUS
        offered = offered_key(headers)
        caller = self.keys.match(offered) if offered is not None else None
        if caller is None:
            raise AuthenticationError("missing or invalid gateway API key")
        if caller.expires_at_ns is not None and self.deps.clock_ns() >= caller.expires_at_ns:
            raise AuthenticationError(f"the gateway API key {caller.name!r} has expired")
        return caller

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

    async def _thread(
        self,
        caller: Caller,
        codec: CallerCodec[R],
        req: R,
        raw: Mapping[str, object],
        wanted: RequestedIdentity,
        headers: Mapping[str, str],
    ) -> tuple[str | None, StepThread]:
        """The session an unnamed request continues (``_access/threads.py``; at most one
        registry read), and the step's thread; a parent step another tenant's is a 404."""
        previous = raw.get("previous_response_id")
        request = ThreadRequest(
            scope=caller.tenant or "",
            named=wanted.session,
            headers=headers,
            conversation=lambda: codec.to_neutral(req).messages,
            opens=req.opens_conversation,
            previous_response_id=previous if isinstance(previous, str) else None,
        )
        found, thread = await thread_request(
            self.deps.steps, request, enabled=self.settings.threading
        )
        self.metrics.threads.labels(thread.match).inc()
        spawned = thread.spawned_by
        if spawned is not None and not await self.guard.may_read(caller, spawned.session):
            raise SessionNotFoundError(spawned.session, param=PARENT_HEADER)
        return found, thread

    async def _resume(
        self, codec: CallerCodec[R], req: R, target: ResumeTarget, after: int | None = None
    ) -> Response:
        """A resumed step's answer (``_resume/resume.py``); its errors in the dialect, never retried
        by the SDKs but past the resumer cap."""
        try:
            if self.resumer is None:
                raise BrokerUnavailableError("this gateway cannot read steps back (no history)")
            return await self.resumer.answer(codec, req, target, after)
        except GatewayError as exc:
            return self._error(codec, exc, target.identity)

    async def _folded(
        self, run: StepRun, codec: CallerCodec[R], reply: Reply, *, forwarded: bool
    ) -> Response:
        """A non-streaming caller's answer: the folded message once the step ended, named
        with the provider's id only when the provider speaks the caller's dialect (a
        translated answer has the gateway's: ``resp_tw-...`` for a Responses caller whatever
        the provider, never ``chatcmpl-...``)."""
        assert run.identity is not None  # begun
        await run.settled()
        assert isinstance(run.output, FoldingOutput)  # a non-streaming caller's output
        if run.error is not None:
            return self._error(codec, run.error, run.identity)
        result = run.output.result()
        if isinstance(result, RecordedError):
            error = UpstreamError(result.message, upstream_status=None, retryable=result.retryable)
            return self._error(codec, error, run.identity)
        provider_id = run.output.provider_id if forwarded else None  # its dialect's id form
        reply = provider_reply(reply, provider_id, run.output.provider_model)
        return Response(
            codec.message_body(result, reply),
            media_type="application/json",
            headers=run.identity.headers(),
        )

    # -- responses ------------------------------------------------------------------------

    def _error(
        self, codec: CallerCodec[R], exc: GatewayError, identity: StepIdentity | None
    ) -> Response:
        if exc.status >= 500:
            told = f"{exc.message} ({exc.detail})" if exc.detail else exc.message
            log.warning("step failed: %s", scrub(told, self._secrets))
        headers = error_headers(exc, identity)
        body = scrub(codec.error_body(exc).decode(), self._secrets).encode()  # no credentials out
        return Response(body, exc.status, headers, media_type="application/json")

    def count(self, route: str, response: Response) -> Response:
        """``response``, counted under ``route``: a route's template
        (``/v1/responses/{response_id}``), never a request's path, so that the series are
        the routes' and no id a caller sent is a label (:data:`UNMATCHED` for any path no
        route serves)."""
        self.metrics.requests.labels(route, str(response.status_code)).inc()
        return response

    async def drain(self, timeout_s: float) -> None:
        """Let running steps finish (bounded by ``timeout_s`` and :attr:`drain_deadline`),
        then cancel the rest (they record ``aborted``)."""
        if self.drain_deadline is not None:
            timeout_s = max(0.0, min(timeout_s, self.drain_deadline - time.monotonic()))
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)
        if self._tasks:
            log.warning(
                "%d step(s) still streaming at the stop's deadline: cancelled (their callers' "
                "streams end without their end marker)",
                len(self._tasks),
            )
        for task in set(self._tasks):
            await cancel_task(task)
        if self.resumer is not None:  # resumers only read: cut at once
            for task in set(self.resumer.tasks):
                task.cancel()


def _resumer(settings: GatewaySettings, deps: GatewayDeps) -> Resumer | None:
    """Resumes steps from the broker (when the gateway can read it back)."""
    if deps.history is None:
        return None
    bounds = ResumeBounds(
        idle_s=settings.max_step_idle_seconds + settings.ack_timeout_s,
        ended_after_s=settings.max_step_seconds + settings.ack_timeout_s + 60.0,
        outbox_bytes=settings.caller_buffer_bytes,
    )
    return Resumer(deps.history, bounds, settings.max_resumers, deps.broker_clock_ns)


def _with(headers: Mapping[str, str], response: Response) -> Response:
    """``response`` with ``headers`` added (the translation's dropped-field list)."""
    for name, value in headers.items():
        response.headers[name] = value
    return response


UNMATCHED = "unmatched"
"""The ``route`` label of a request no route serves (any unknown path: one series)."""


def _counted(gw: Gateway, route: BaseRoute) -> BaseRoute:
    """``route``, its answers counted under its template (``GET /metrics`` is not counted:
    scrapes would count themselves)."""
    if not isinstance(route, HttpRoute) or route.path == "/metrics":
        return route
    endpoint, template = route.endpoint, route.path

    async def counted(request: Request) -> Response:
        response: Response = await endpoint(request)
        return gw.count(template, response)

    return HttpRoute(route.path, counted, methods=route.methods, name=route.name)


def _not_found_handler(gw: Gateway) -> Callable[[Request, Exception], Awaitable[Response]]:
    """Starlette's 404 and 405, counted: a 405 under the template of the route whose method it
    was not, a 404 as :data:`UNMATCHED`."""

    async def handle(request: Request, exc: Exception) -> Response:
        matched = request.scope.get("route")
        template = matched.path if isinstance(matched, HttpRoute) else UNMATCHED
        return gw.count(template, await _not_found(request, exc))

    return handle


async def _not_found(request: Request, exc: Exception) -> Response:
    """Starlette's 404 and 405 in the path's dialect (Anthropic's under ``/v1/messages``),
    keeping the headers it set (a 405's ``allow``)."""
    status = exc.status_code if isinstance(exc, HTTPException) else 404
    message = exc.detail if isinstance(exc, HTTPException) else "not found"
    headers = exc.headers if isinstance(exc, HTTPException) else None
    if request.scope["path"].startswith("/v1/messages"):
        kind = "not_found_error" if status == 404 else "invalid_request_error"
        body: dict[str, object] = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        body = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
    return JSONResponse(body, status_code=status, headers=headers)


class GatewayApp:
    """The gateway's ASGI app: ``POST`` to the two model endpoints goes straight to their
    handlers; every other request, and the lifespan, through the Starlette app.

    Starlette's middleware stack, router and per-route wrappers cost ~50 us of every step's
    time to first chunk (bench/bench_gateway.py (d)) and do nothing these two routes need: an
    unexpected exception still becomes uvicorn's 500, as Starlette's would.
    """

    def __init__(self, starlette: Starlette, gw: Gateway) -> None:
        self.starlette = starlette
        self.state = starlette.state
        self._gw = gw
        self._handlers = {
            "/v1/chat/completions": gw.chat_completions,
            "/v1/messages": gw.messages,
            "/v1/responses": gw.responses,
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self._gw.keys:
            refused = keyless_refusal(scope["headers"])
            if refused is not None:
                await dialect_error(scope["path"], refused)(scope, receive, send)
                return
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self._handlers.get(scope["path"])
            if handler is not None:
                response = await handler(Request(scope, receive))
                await response(scope, receive, send)
                return
        await self.starlette(scope, receive, send)


def _catalog_routes(gw: Gateway) -> list[BaseRoute]:
    """``/v1/models``, ``/v1/messages/count_tokens`` and ``/openapi.json`` (their modules)."""
    env = gw.settings.provider_env
    catalog = ModelCatalog(env, gw.deps.monotonic, public=gw.routes.table.names)

    async def models(request: Request) -> Response:
        return JSONResponse(await catalog.listing())

    async def openapi(request: Request) -> Response:
        return JSONResponse(openapi_document(_version()))

    count = CountTokens(env, gw.authenticate, gw._read_body, gw._secrets)
    return [
        require_key(gw.authenticate, HttpRoute("/v1/models", models, methods=["GET"])),
        HttpRoute("/v1/messages/count_tokens", count.handle, methods=["POST"]),
        HttpRoute("/openapi.json", openapi, methods=["GET"]),
    ]


def _targets(route: Route, routing: Routing | None) -> list[Target]:
    """The deployments a call may reach: its route, or its routed plan's first deployment and
    every one it may fall back to."""
    if routing is None:
        return [(route.provider, route.model, None)]
    specs = [routing.first.spec, *routing.plan.reachable()]
    return [(s.provider, s.model, s.price) for s in specs]


def _version() -> str:
    try:
        return importlib.metadata.version("tokenwire")
    except importlib.metadata.PackageNotFoundError:
        return "0"


def create_app(settings: GatewaySettings, deps: GatewayDeps) -> GatewayApp:
    """The gateway as an ASGI app; the caller owns ``deps`` (connections, publisher).

    ``app.state.gateway`` is the :class:`Gateway` (metrics, running steps). On shutdown the
    app waits up to ``settings.ack_timeout_s`` for running steps. Raises
    :class:`tokenwire.config.ConfigError` for a provider credential or base URL no request
    could be sent with (``GatewaySettings.from_env`` refuses them too).
    """
    check_provider_env(settings.provider_env)
    gw = Gateway(settings, deps)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await gw.live_keys.start()
        await gw.routes.start()
        try:
            async with gw.limiter.running():  # what it holds is given back after the drain
                yield
                await gw.drain(settings.ack_timeout_s)
        finally:
            await gw.routes.stop()
            await gw.live_keys.stop()

    model_routes = [
        HttpRoute("/v1/chat/completions", gw.chat_completions, methods=["POST"]),
        HttpRoute("/v1/messages", gw.messages, methods=["POST"]),
        HttpRoute("/v1/responses", gw.responses, methods=["POST"]),
    ]  # counted by their handlers (GatewayApp calls them without Starlette)
    routes = [
        require_key(
            gw.authenticate, HttpRoute("/v1/responses/{response_id}", gw.retrieve, methods=["GET"])
        ),
        *_catalog_routes(gw),
        # The session routes read recorded content: behind the same gateway keys as the model
        # endpoints (the viewer page itself holds no data and sends the key it is given).
        *(require_key(gw.authenticate, r) for r in deps.extra_routes),
        require_key(gw.authenticate, usage_route(deps.store)),
        *(require_key(gw.authenticate, r) for r in keys_routes(deps.keys, gw._read_body)),
        HttpRoute("/healthz", gw.healthz, methods=["GET"]),
        HttpRoute("/readyz", gw.readyz, methods=["GET"]),
        HttpRoute("/metrics", gw.metrics_text, methods=["GET"]),
    ]
    app = Starlette(
        routes=[*model_routes, *(_counted(gw, r) for r in routes)],
        lifespan=lifespan,
        exception_handlers={HTTPException: _not_found_handler(gw)},
    )
    app.state.gateway = gw
    return GatewayApp(app, gw)
