"""What the gateway runs on (:class:`GatewayDeps`): its own seam, calling a provider
(:class:`Upstream`, in ``_routing/upstream.py`` with its real and canned implementations),
and the broker's (``broker.ChunkSink`` and ``broker.StepAllocator``, whose real and in-memory
implementations live in the broker package), with readiness, the clock and the id source.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from starlette.routing import BaseRoute

from tokenwire.broker import (
    AllowanceBoard,
    ChunkSink,
    CooldownBoard,
    KeyBook,
    SessionOwnership,
    StepAllocator,
)
from tokenwire.observability import OtelProviders, no_otel
from tokenwire.services.gateway._observe.ready import READY, Readiness
from tokenwire.services.gateway._resume.step_source import StepSource
from tokenwire.services.gateway._routing.upstream import Upstream
from tokenwire.store import Store


def _new_session() -> str:
    return uuid.uuid4().hex


async def _always_ready() -> Readiness:
    return READY


def _always_live() -> bool:
    return True


@dataclass(frozen=True)
class GatewayDeps:
    """What the app runs on. ``run()`` builds the real ones; tests pass fakes.

    - ``upstream``: calls providers; ``sink``: publishes chunks; ``steps``: claims steps;
    - ``ready``: whether the gateway can capture steps, and why not (``/readyz``,
      ``_observe/ready.py``);
    - ``live``: whether the process can still serve at all (``/healthz``): false once the
      broker connection is closed for good (nats-py never reopens a closed client), so an
      orchestrator restarts the gateway instead of leaving it answering errors;
    - ``clock_ns``: wall clock in Unix ns (envelope times); ``new_id``: session and response
      ids; ``monotonic``: for durations (metrics);
    - ``extra_routes``: routes served beside the gateway's own (the session events, sessions,
      messages and viewer routes of ``tokenwire.replay``);
    - ``otel``: the OpenTelemetry providers the model calls' spans and metrics go to (the
      API's no-op ones unless an OTLP endpoint is configured, docs/telemetry.md);
    - ``owners``: whose a session is (``broker.SessionOwners``, or its memory twin), for a
      gateway whose keys have tenants (``_access/owners.py``); ``create_app`` refuses such keys
      without it.
    - ``store``: returns the store the gateway's read routes use (``GET /v1/usage``); None:
      the gateway has none, and those routes answer 503.
    - ``history``: reads a claimed step back from the broker, for a caller that resumes it
      (``_resume/step_source.py``); None: a retried step cannot be resumed (it answers 503);
      ``broker_clock_ns``: the clock a claim's age is read against (the broker's time of
      the claim's record; Unix ns, as the broker's servers keep it).
    - ``cooldowns``: the routed deployments' shared cooldowns; ``keys``: the keys bucket every
      gateway watches (``_access/live_keys.py``; None: the keys file and flat list only).
    """

    upstream: Upstream
    sink: ChunkSink
    steps: StepAllocator
    ready: Callable[[], Awaitable[Readiness]] = _always_ready
    live: Callable[[], bool] = _always_live
    clock_ns: Callable[[], int] = time.time_ns
    new_id: Callable[[], str] = _new_session
    monotonic: Callable[[], float] = time.perf_counter
    extra_routes: Sequence[BaseRoute] = ()
    otel: OtelProviders = field(default_factory=no_otel)
    owners: SessionOwnership | None = None
    store: Callable[[], Store] | None = None
    history: StepSource | None = None
    broker_clock_ns: Callable[[], int] = time.time_ns
    cooldowns: CooldownBoard | None = None
    keys: KeyBook | None = None
    allowances: AllowanceBoard | None = None
    limits_clock_ns: Callable[[], int] = time.time_ns
