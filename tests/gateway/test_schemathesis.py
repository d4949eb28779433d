"""Schemathesis against the real gateway's ``GET /openapi.json`` (issue 12, part 5).

The gateway runs for real (a real socket, the session routes on a SQLite store, a real
nats-server, the scripted provider behind it on its own socket) in a thread of its own, since
schemathesis calls it synchronously. Every operation the document describes is fuzzed, in
positive and negative mode, and each answer must be: not a 5xx; of a status, content type and
body the document declares; and, when it is an error, the endpoint's own dialect, checked with
the official SDKs' error types (an independent oracle, not the gateway's encoders): Anthropic's
``ErrorResponse`` on ``/v1/messages*``, OpenAI's ``ErrorObject`` everywhere else.

Bounded in the default suite (``SCHEMATHESIS_EXAMPLES``, 10 per operation, derandomized);
``make fuzz`` runs more (``SCHEMATHESIS_EXAMPLES=N make fuzz``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic.types
import httpx
import openai.types.shared
import pydantic
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.fixtures.broker import drop_topology, fresh_topology
from tests.gateway._helpers import GATEWAY_KEY
from tokenwire.broker import connect, ensure_topology
from tokenwire.replay import events_router
from tokenwire.services.gateway import GatewayServer, GatewaySettings, broker_deps
from tokenwire.services.gateway._api.openapi import openapi_document
from tokenwire.services.scripted_provider import ScriptedServer, ScriptedSettings
from tokenwire.store import open_store

pytestmark = pytest.mark.slow

EXAMPLES = int(os.environ.get("SCHEMATHESIS_EXAMPLES", "10"))
AUTH = {"authorization": f"Bearer {GATEWAY_KEY}"}
_START_S = 60.0

ANTHROPIC_DOCUMENTED_ONLY = frozenset({"request_too_large"})
"""Anthropic error types its API reference lists (the 413 answer) that the SDK's
``ErrorResponse`` union does not name."""


@dataclasses.dataclass
class _Live:
    """The gateway stack running in its own thread and event loop."""

    nats_url: str
    store: Path
    url: str = ""
    failure: BaseException | None = None
    _ready: threading.Event = dataclasses.field(default_factory=threading.Event)
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None

    def run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # reported to the test thread, which fails on it
            self.failure = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with ScriptedServer(ScriptedSettings(seed=5, length=4)) as scripted:
            env = {
                "TOKENWIRE_SCRIPTED_BASE_URL": scripted.url,
                "ANTHROPIC_API_KEY": "sk-ant-schemathesis",
                "TOKENWIRE_ANTHROPIC_BASE_URL": scripted.url,
                "OPENAI_API_KEY": "sk-openai-schemathesis",
                "TOKENWIRE_OPENAI_BASE_URL": scripted.url + "/v1",
            }
            nc = await connect(self.nats_url, name="tokenwire-schemathesis")
            topology = fresh_topology()
            store = open_store(f"sqlite:///{self.store}")
            try:
                await ensure_topology(nc, topology, ack_wait_s=30.0, priority_timeout_s=2.0)
                real = await broker_deps(nc, topology)
                routes = events_router(lambda: nc, topology, lambda: store).routes
                real.deps = dataclasses.replace(
                    real.deps, extra_routes=routes, store=lambda: store
                )  # as the gateway's run() wires it
                settings = GatewaySettings(
                    port=0,
                    keys=frozenset({GATEWAY_KEY}),
                    provider_env=env,
                    partitions=topology.partitions,
                    ack_timeout_s=10.0,
                )
                try:
                    async with GatewayServer(settings, real.deps) as server:
                        self.url = server.url
                        self._ready.set()
                        await self._stop.wait()
                finally:
                    await real.aclose()
            finally:
                await store.close()
                await drop_topology(nc, topology)
                await nc.close()

    def wait_ready(self) -> None:
        if not self._ready.wait(_START_S) or self.failure is not None or not self.url:
            raise RuntimeError("the gateway stack did not start") from self.failure

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended
                self._loop.call_soon_threadsafe(self._stop.set)


@pytest.fixture(scope="module")
def live_gateway(nats_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    live = _Live(nats_url, tmp_path_factory.mktemp("schemathesis") / "store.db")
    thread = threading.Thread(target=live.run, name="gateway under schemathesis", daemon=True)
    thread.start()
    try:
        live.wait_ready()
        yield live.url
    finally:
        live.stop()
        thread.join(_START_S)
    assert not thread.is_alive(), "the gateway stack did not stop"
    if live.failure is not None:
        raise live.failure


@pytest.fixture(scope="module")
def gateway_schema(live_gateway: str) -> Any:
    """The document the running gateway serves, as schemathesis reads it."""
    return schemathesis.openapi.from_url(live_gateway + "/openapi.json", timeout=10)


OPERATIONS = sorted(
    (method.upper(), path)
    for path, item in openapi_document("0")["paths"].items()
    for method in item
)
"""The operations, known at collection; a test checks the served document has no others.
(Schemathesis's own lazy ``from_fixture`` loader fails on pytest 9, which dropped the
``Node._nodeid`` it rewrites, so each operation's cases come from ``as_strategy``.)"""
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES <= 100,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def dialect_error(path: str, status: int, body: Any) -> str | None:
    """Why ``body`` is not an error answer in ``path``'s dialect (None: it is).

    The oracle is the providers' SDKs: what ``anthropic.types.ErrorResponse`` and
    ``openai.types.shared.ErrorObject`` (inside ``{"error": ...}``) accept.
    """
    if path.startswith("/v1/messages"):
        if isinstance(body, dict) and (body.get("error") or {}).get("type") in (
            ANTHROPIC_DOCUMENTED_ONLY
        ):
            body = {**body, "error": {**body["error"], "type": "invalid_request_error"}}
        try:
            anthropic.types.ErrorResponse.model_validate(body)
        except pydantic.ValidationError as exc:
            return f"not Anthropic's error shape on {path} ({status}): {exc}"
        return None
    if not isinstance(body, dict) or set(body) != {"error"}:
        return f"not OpenAI's error shape on {path} ({status}): {body!r}"
    try:
        openai.types.shared.ErrorObject.model_validate(body["error"])
    except pydantic.ValidationError as exc:
        return f"not OpenAI's error shape on {path} ({status}): {exc}"
    return None


def test_the_served_document_is_the_one_fuzzed(live_gateway: str) -> None:
    served = httpx.get(live_gateway + "/openapi.json", timeout=30).json()["paths"]
    assert sorted((m.upper(), p) for p, item in served.items() for m in item) == OPERATIONS


def _with_input(method: str, path: str) -> bool:
    """The operation takes parameters or a body, so negative mode has something to break."""
    item = openapi_document("0")["paths"][path][method.lower()]
    return bool(item.get("parameters") or item.get("requestBody"))


CASES = [
    pytest.param(method, path, mode, id=f"{method} {path} {mode.value}")
    for method, path in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    if mode is GenerationMode.POSITIVE or _with_input(method, path)
]
FIXED_QUERY = {"/v1/sessions/{session}/events": {"follow": "false"}}
"""A following event stream never ends by design: fuzzed cases read what is there and end."""


@pytest.mark.parametrize(("method", "path", "mode"), CASES)
def test_every_operation_answers_in_its_dialect(
    gateway_schema: Any,
    live_gateway: str,
    method: str,
    path: str,
    mode: GenerationMode,
    capsys: pytest.CaptureFixture[str],
) -> None:
    operation = gateway_schema[path][method]
    cases = 0

    @FUZZ
    @given(case=operation.as_strategy(mode, query=FIXED_QUERY.get(path)))
    def run(case: Any) -> None:
        nonlocal cases
        cases += 1
        check_answer(case, case.call(base_url=live_gateway, headers=AUTH, timeout=30))

    run()
    if "SCHEMATHESIS_EXAMPLES" in os.environ:  # the long run reports what it sent
        with capsys.disabled():
            print(f"\nschemathesis {method} {path} {mode.value}: {cases} cases")


def check_answer(case: Any, response: Any) -> None:
    """No 5xx; status, content type and body as documented; errors in the path's dialect."""
    label = f"{case.method} {case.formatted_path}"
    assert response.status_code < 500, f"{label}: {response.status_code} {response.text[:300]}"
    case.validate_response(
        response,
        checks=[status_code_conformance, content_type_conformance, response_schema_conformance],
    )
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            pytest.fail(f"{label} answered {response.status_code} with a body that is not JSON")
        problem = dialect_error(case.path, response.status_code, body)
        assert problem is None, problem


@pytest.mark.parametrize(
    ("path", "body", "ok"),
    [
        (
            "/v1/messages",
            {"type": "error", "error": {"type": "not_found_error", "message": "m"}},
            True,
        ),
        ("/v1/messages", {"error": {"type": "invalid_request_error", "message": "m"}}, False),
        (
            "/v1/chat/completions",
            {"error": {"message": "m", "type": "t", "param": None, "code": None}},
            True,
        ),
        ("/v1/chat/completions", {"type": "error", "error": {"type": "t", "message": "m"}}, False),
        ("/v1/models", {"error": {"type": "t"}}, False),
    ],
)
def test_the_dialect_oracle_tells_the_shapes_apart(path: str, body: Any, ok: bool) -> None:
    assert (dialect_error(path, 400, body) is None) == ok


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/v1/messages", 405),
        ("PUT", "/v1/messages/count_tokens", 405),
        ("GET", "/v1/messages/nothing-here", 404),
        ("GET", "/v1/chat/completions", 405),
        ("DELETE", "/v1/responses", 405),
        ("GET", "/v1/nothing-here", 404),
    ],
)
def test_unknown_routes_and_methods_answer_in_the_paths_dialect(
    live_gateway: str, method: str, path: str, status: int
) -> None:
    """Starlette's own 404/405 once answered OpenAI's shape on ``/v1/messages`` and dropped
    the 405's ``allow`` header (found by the schemathesis CLI's ``unsupported_method``)."""
    response = httpx.request(method, live_gateway + path, headers=AUTH, timeout=30)
    assert response.status_code == status
    assert dialect_error(path, status, response.json()) is None
    if status == 405:
        assert "POST" in response.headers["allow"]


@pytest.mark.parametrize("offset", [str(2**63), "1" + "0" * 30])
def test_an_offset_beyond_the_stores_integers_is_a_400(live_gateway: str, offset: str) -> None:
    """Found by schemathesis at 100 examples: the store's driver raised OverflowError (a 500)."""
    response = httpx.get(
        live_gateway + "/v1/sessions", params={"offset": offset}, headers=AUTH, timeout=30
    )
    assert response.status_code == 400
    assert dialect_error("/v1/sessions", 400, response.json()) is None
