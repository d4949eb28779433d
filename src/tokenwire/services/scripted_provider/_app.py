"""The ASGI app: OpenAI- and Anthropic-compatible endpoints that stream scripts."""

from __future__ import annotations

import asyncio
import collections
import itertools
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import anyio
import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tokenwire.services.scripted_provider import _anthropic, _openai
from tokenwire.services.scripted_provider._actions import Emit, Frame, Stall, plan_body, plan_stream
from tokenwire.services.scripted_provider._errors import (
    RecordingUnavailableError,
    ScriptedRequestError,
)
from tokenwire.services.scripted_provider._player import PlayedResponse, install_abort_filter
from tokenwire.services.scripted_provider._request import Dialect, StepRequest, decode_request
from tokenwire.services.scripted_provider._script import (
    INPUT_TOKENS_PER_MESSAGE,
    SCENARIOS,
    ProviderFailure,
    Script,
    build_script,
)
from tokenwire.services.scripted_provider._settings import (
    ScriptedSettings,
    apply_overrides,
    header_options,
)

SSE_TYPE = "text/event-stream; charset=utf-8"
JSON_TYPE = "application/json"
RECORDING_HEADER = "x-scripted-recording"
_REQUEST_ID_HEADER: Mapping[Dialect, str] = {"openai": "x-request-id", "anthropic": "request-id"}
_EVENT_END = re.compile(rb"(?<=\n\n)|(?<=\r\n\r\n)")


RECEIVED_KEPT = 256
"""Requests kept in :attr:`ScriptedProvider.received` (the oldest go first)."""


@dataclass(frozen=True)
class ReceivedRequest:
    """One request as the provider received it (tests check what a gateway sent on)."""

    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        """The body, decoded."""
        return msgspec.json.decode(self.body)


class _Renderer(Protocol):
    def frames(self) -> list[Frame]: ...

    def error_frame(self) -> bytes: ...

    def body(self) -> bytes: ...


class ScriptedProvider:
    """The provider's state: settings, the injected clock and the shutdown signal.

    ``closing`` is set when the server shuts down: stalled and paced streams then close their
    connection at once instead of holding the shutdown.
    """

    def __init__(self, settings: ScriptedSettings, clock: Callable[[], float]) -> None:
        self.settings = settings
        self.clock = clock
        self.closing = asyncio.Event()
        self.received: collections.deque[ReceivedRequest] = collections.deque(maxlen=RECEIVED_KEPT)

    def app(self) -> Starlette:
        """The Starlette app serving this provider."""
        install_abort_filter()
        return Starlette(
            routes=[
                Route("/v1/chat/completions", _Endpoint(self, "openai"), methods=["POST"]),
                Route("/v1/messages", _Endpoint(self, "anthropic"), methods=["POST"]),
                Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
                Route(
                    "/v1/responses", _Endpoint(self, "openai", replay_only=True), methods=["POST"]
                ),
                Route("/v1/models", _models, methods=["GET"]),
                Route("/healthz", _healthz, methods=["GET"]),
            ]
        )

    async def _count_tokens(self, request: Request) -> Response:
        """Anthropic's token count: the input tokens a message to this request would report."""
        body = await request.body()
        self.received.append(ReceivedRequest(request.url.path, dict(request.headers), body))
        try:
            step = decode_request(body, request.headers)
        except ScriptedRequestError as exc:
            return _error_response("anthropic", exc.status, _client_failure(exc))
        return JSONResponse({"input_tokens": INPUT_TOKENS_PER_MESSAGE * max(1, step.message_count)})

    async def replay_only(self, request: Request) -> ASGIApp:
        """``/v1/responses``: the ``recording`` scenario only (no scripts in that dialect)."""
        body = await request.body()
        self.received.append(ReceivedRequest(request.url.path, dict(request.headers), body))
        try:
            step = decode_request(body, request.headers)
            if step.scenario != "recording":
                message = (
                    "the Responses API is served only by replaying a recording (model 'recording')"
                )
                return JSONResponse(
                    {"error": {"message": message, "type": "invalid_request_error"}}, 400
                )
            return await self._replay(request, apply_overrides(self.settings, step.options))
        except ScriptedRequestError as exc:
            return _error_response("openai", exc.status, _client_failure(exc))

    async def respond(self, request: Request, dialect: Dialect) -> ASGIApp:
        """The response to one request; a caller's mistake is answered in the dialect (4xx)."""
        body = await request.body()
        self.received.append(ReceivedRequest(request.url.path, dict(request.headers), body))
        try:
            step = decode_request(body, request.headers)
            options = {**step.options, **header_options(request.headers)}
            settings = apply_overrides(self.settings, options)
            if step.scenario == "recording":
                return await self._replay(request, settings)
            script = build_script(step.scenario, step, settings, dialect)
        except ScriptedRequestError as exc:
            return _error_response(dialect, exc.status, _client_failure(exc))
        return self._scripted(script, step, settings)

    def _scripted(self, script: Script, step: StepRequest, settings: ScriptedSettings) -> ASGIApp:
        headers = {_REQUEST_ID_HEADER[script.dialect]: script.request_id}
        failure = script.failure
        if failure is not None and (script.http_status or not step.stream):
            return _error_response(script.dialect, failure.status(script.dialect), failure, headers)
        renderer = self._renderer(script, step)
        if step.stream:
            error_frame = renderer.error_frame() if failure else None
            actions = plan_stream(script, renderer.frames(), error_frame)
            if settings.first_token_s > 0:
                actions = itertools.chain([Stall(settings.first_token_s)], actions)
            headers |= {"content-type": SSE_TYPE, "cache-control": "no-cache"}
            return self._played(actions, headers, settings.token_rate)
        return self._played(
            plan_body(script, renderer.body()), headers | {"content-type": JSON_TYPE}, 0
        )

    def _renderer(self, script: Script, step: StepRequest) -> _Renderer:
        if script.dialect == "anthropic":
            return _anthropic.AnthropicRenderer(script, model=step.model)
        created = int(self.clock())
        return _openai.OpenAIRenderer(
            script, model=step.model, created=created, include_usage=step.include_usage
        )

    def _played(self, actions: Any, headers: dict[str, str], rate: float) -> PlayedResponse:
        return PlayedResponse(
            actions, status=200, headers=headers, token_rate=rate, closing=self.closing
        )

    async def _replay(self, request: Request, settings: ScriptedSettings) -> ASGIApp:
        """The recording's bytes verbatim, one SSE event per paced send."""
        path = _recording_path(request.headers.get(RECORDING_HEADER), settings)
        try:
            data = await anyio.Path(path).read_bytes()
        except OSError as exc:
            raise RecordingUnavailableError(str(path), exc.strerror or str(exc)) from exc
        events = [Emit(piece, paced=True) for piece in _EVENT_END.split(data) if piece]
        return self._played(events, {"content-type": SSE_TYPE}, settings.token_rate)


def _recording_path(header: str | None, settings: ScriptedSettings) -> Path:
    """The file to replay: the header's path inside ``recording_root``, else ``recording``."""
    if header is None:
        if settings.recording is None:
            raise RecordingUnavailableError("", "no X-Scripted-Recording header, no --recording")
        return Path(settings.recording)
    if settings.recording_root is None:
        raise RecordingUnavailableError(header, "the server allows no recording header")
    root = Path(settings.recording_root).resolve()
    path = (root / header).resolve()
    if not path.is_relative_to(root):
        raise RecordingUnavailableError(header, f"outside the recording root {root}")
    return path


class _Endpoint:
    """One POST endpoint in one dialect, as a plain ASGI app (it may answer with a stream)."""

    def __init__(
        self, provider: ScriptedProvider, dialect: Dialect, *, replay_only: bool = False
    ) -> None:
        self.provider = provider
        self.dialect = dialect
        self.replay_only = replay_only  # the Responses API: only recordings are replayed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        if self.replay_only:
            response = await self.provider.replay_only(request)
        else:
            response = await self.provider.respond(request, self.dialect)
        await response(scope, receive, send)


async def _models(request: Request) -> Response:
    """The scenarios as models, in a shape both OpenAI's and Anthropic's list readers accept."""
    data = [
        {"id": name, "object": "model", "type": "model", "created": 0, "owned_by": "scripted"}
        for name in SCENARIOS
        if name != "recording"
    ]
    return JSONResponse({"object": "list", "data": data, "has_more": False})


async def _healthz(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


def _client_failure(exc: ScriptedRequestError) -> ProviderFailure:
    kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
    code = "model_not_found" if exc.status == 404 else "invalid_request_error"
    return ProviderFailure(str(exc), code, kind, exc.status, exc.status, retryable=False)


def _error_response(
    dialect: Dialect,
    status: int,
    failure: ProviderFailure,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """The JSON error body each provider answers with before any stream."""
    extra = dict(headers or {})
    if status == 429:  # as OpenAI and Anthropic answer a rate limit
        extra["retry-after"] = "1"
        extra["retry-after-ms"] = "1000"
        extra["x-ratelimit-remaining-requests"] = "0"
    if dialect == "openai":
        body = _openai.error_object(failure)
    else:
        body = _anthropic.error_object(failure)
    return Response(msgspec.json.encode(body), status, extra, media_type=JSON_TYPE)


def create_app(
    settings: ScriptedSettings | None = None, *, clock: Callable[[], float] = time.time
) -> Starlette:
    """The scripted provider as an ASGI app. ``clock`` gives OpenAI's ``created`` seconds.

    Example::

        app = create_app(ScriptedSettings(token_rate=50), clock=lambda: 1_700_000_000)
    """
    return ScriptedProvider(settings or ScriptedSettings(), clock).app()
