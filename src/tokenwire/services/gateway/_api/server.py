"""Running the gateway for real: broker connection, publisher, step registry, uvicorn.

:func:`run` is what ``tokenwire gateway`` calls; :class:`GatewayServer` runs the same app on a
real socket inside the caller's event loop (tests, ``tokenwire up``, benchmarks).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import uvicorn

from tokenwire import config
from tokenwire.broker import (
    Allowances,
    BrokerError,
    ChunkPublisher,
    Connection,
    Cooldowns,
    KeysBucket,
    Restored,
    Restorer,
    SessionOwners,
    StepRegistry,
    Topology,
    check_layout,
    connect,
    ensure_cooldowns_bucket,
    ensure_topology,
    stream_info,
    stream_missing,
)
from tokenwire.config import ConfigError
from tokenwire.leftovers import LEFTOVERS, counted
from tokenwire.observability import OtelProviders, no_otel, otel_from_env
from tokenwire.replay import SseStats, events_router
from tokenwire.services.gateway._api.app import Gateway, create_app
from tokenwire.services.gateway._api.edge import KEEP_ALIVE_S, bounded_protocol
from tokenwire.services.gateway._api.settings import GatewaySettings
from tokenwire.services.gateway._observe.ready import (
    PUBLISH_STALL_S,
    NotReady,
    Readiness,
    readiness_of,
)
from tokenwire.services.gateway._resume.step_source import BrokerStepSource
from tokenwire.services.gateway._routing.upstream import HttpUpstream
from tokenwire.services.gateway._steps.deps import GatewayDeps
from tokenwire.store import Store, open_store
from tokenwire.variables import GATEWAY_ADDR, NATS_URL

log = logging.getLogger("tokenwire.gateway")
PUBLISH_WINDOW = 4096
"""Chunks in flight (published, not yet acknowledged) before publishing waits. Under load the
acks of a shared-CPU broker took 50-100 ms, so the publisher's default of 1024 capped the
gateway near 1024 / 0.07 s = 15k chunks/s and made every step wait for acks; 4096 (a few MiB
of retained envelopes) keeps the window out of the way (bench/bench_gateway.py)."""
GC_THRESHOLDS = (100_000, 50, 100)
"""The cyclic collector's thresholds in the gateway process (Python's are 700, 10, 10). A step
allocates a few dozen objects per chunk, so the default ran a young-generation pass every ~20
chunks and, with thousands of in-flight chunks surviving into older generations, frequent
full passes: ~17% of the gateway's CPU per chunk (28.5 against 23.6 us, bench/bench_gateway.py
load (b)). Objects alive when the gateway starts are frozen out of every pass. Garbage cycles
live longer before they are freed: those found young within 100,000 allocations, older ones
at the older generations' passes (every 50 young passes, and every 100 of those)."""
HTTP_IMPL = "httptools"
"""uvicorn's HTTP/1.1 protocol: httptools (C parser) costs the gateway about half the CPU per
response write of the pure-Python h11 (bench/bench_gateway.py, docs/gateway-internals.md,
"Performance")."""


def _edge_options(settings: GatewaySettings) -> dict[str, Any]:
    """uvicorn options of the HTTP edge: httptools with the edge's bounds (``_api/edge.py``), and
    keep-alive connections kept longer than the SDKs' pools keep them."""
    return {"http": bounded_protocol(settings.edge), "timeout_keep_alive": KEEP_ALIVE_S}


def check_bind(settings: GatewaySettings) -> None:
    """Without gateway keys the gateway must not listen beyond loopback."""
    if not settings.authenticated and not settings.loopback_only:
        raise ConfigError(
            GATEWAY_ADDR.env,
            f"{settings.host}:{settings.port}",
            "without TOKENWIRE_GATEWAY_KEYS or TOKENWIRE_GATEWAY_KEYS_FILE the gateway listens "
            "on loopback only",
        )


@dataclass
class BrokerDeps:
    """The real dependencies and what must be closed with them."""

    deps: GatewayDeps
    publisher: ChunkPublisher
    steps: StepRegistry
    upstream: HttpUpstream

    async def aclose(self) -> None:
        """Flush the publisher (bounded), stop the registry, close the provider connections."""
        await self.publisher.close()
        await self.steps.close()
        await self.upstream.aclose()


async def broker_deps(
    nc: Connection,
    topology: Topology,
    *,
    publish_window: int = PUBLISH_WINDOW,
    otel: OtelProviders | None = None,
    step_retry: tuple[int, float] = (16, 30.0),
    claim_idle_s: float = 0.0,
    reprovision: Callable[[], Awaitable[None]] | None = None,
    store: Callable[[], Store] | None = None,
) -> BrokerDeps:
    """Publisher, step registry and readiness probe on an open connection; ``otel``: where the
    model calls' spans and metrics go (nothing by default); ``claim_idle_s``: the bound on a
    step's silence kept with every claim (``StepRecord.idle_s``, read by the assembler before
    it records a step abandoned); ``reprovision``: for a gateway that provisions, provision
    again when the probe finds a chunk stream or registry bucket missing (issue 48), and make
    the routed deployments' cooldowns bucket and the keys bucket again when their watches
    find them missing;
    ``store``: where a step gone from the broker's retention is read back from (``GET
    /v1/responses/{id}``; None: nowhere)."""
    publisher = await ChunkPublisher(nc, topology, window=publish_window).start()
    retries, retry_s = step_retry
    steps = await StepRegistry.open(
        nc, topology, retries=retries, retry_s=retry_s, idle_s=claim_idle_s
    )
    upstream = HttpUpstream()
    restorer = Restorer(nc, topology, interval_s=REPROVISION_INTERVAL_S)
    restoring: set[asyncio.Task[Restored]] = set()

    async def ready() -> Readiness:
        readiness = await _readiness(nc, topology, publisher)
        if reprovision is not None and {"stream-missing", "registry-missing"} & set(
            readiness.reasons
        ):  # in the background, at most once per interval: the probe answers at once
            task = asyncio.create_task(restorer.provision(reprovision))
            restoring.add(task)
            task.add_done_callback(restoring.discard)
        return readiness

    def live() -> bool:
        return not nc.is_closed

    async def make_bucket() -> None:
        await ensure_cooldowns_bucket(nc, topology)

    async def make_keys_bucket() -> None:
        await restorer.keys_bucket()

    provisions = reprovision is not None
    cooldowns = Cooldowns(nc, topology.cooldowns_bucket, make=make_bucket if provisions else None)
    keys = KeysBucket(nc, topology.keys_bucket, make=make_keys_bucket if provisions else None)
    allowances = Allowances(nc, topology.limits_bucket, restore=restorer.limits)
    deps = GatewayDeps(
        upstream=upstream,
        sink=publisher,
        steps=steps,
        ready=ready,
        live=live,
        otel=otel or no_otel(),
        owners=SessionOwners(nc, topology),
        history=BrokerStepSource(nc, topology, store),
        cooldowns=cooldowns,
        keys=keys,
        allowances=allowances,
    )
    return BrokerDeps(deps, publisher, steps, upstream)


REPROVISION_INTERVAL_S = 30.0
"""At most one provisioning a missing stream or bucket again per this long (logged)."""


async def _readiness(nc: Connection, topology: Topology, publisher: ChunkPublisher) -> Readiness:
    """What keeps the gateway from capturing steps (``_observe/ready.py``): the connection, every
    chunk stream and registry bucket answering (each holds some sessions), the acks."""
    if not nc.is_connected:
        return Readiness(("disconnected",), "disconnected: no connection to the broker")
    found: dict[NotReady, list[str]] = {}
    named: list[tuple[str, NotReady]] = [(s, "stream-missing") for s in topology.chunk_streams]
    named += [(f"KV_{b}", "registry-missing") for b in topology.registry_buckets]
    answers = await asyncio.gather(
        *(stream_info(nc, name, timeout_s=1.0) for name, _ in named), return_exceptions=True
    )
    for (name, missing_reason), answer in zip(named, answers, strict=True):
        if isinstance(answer, BrokerError):
            found.setdefault(missing_reason if stream_missing(answer) else "broker", []).append(
                name
            )
        elif isinstance(answer, BaseException):
            raise answer
    waited = publisher.oldest_unacked_s()
    if waited > PUBLISH_STALL_S:
        found["publish-stalled"] = [f"a chunk unacknowledged for {waited:.0f} s"]
    return readiness_of(found)


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Inherited by accepted connections. asyncio sets it only on sockets created with
    # proto=IPPROTO_TCP (this one is 0): without it Nagle holds a response's first body bytes
    # behind its unacknowledged headers until the caller's delayed ACK, ~40 ms.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class GatewayServer:
    """The app served by uvicorn on ``host:port`` (port 0: a free one) in this event loop.

    ::

        async with GatewayServer(settings, deps) as server:
            httpx.post(server.url + "/v1/chat/completions", ...)
    """

    def __init__(self, settings: GatewaySettings, deps: GatewayDeps) -> None:
        check_bind(settings)
        self.app = create_app(settings, deps)
        self._sock = _listen(settings.host, settings.port)
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            lifespan="on",
            access_log=False,
            **_edge_options(settings),
            timeout_graceful_shutdown=int(settings.ack_timeout_s),
        )
        self._server = uvicorn.Server(config)
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` actually bound."""
        host, port = self._sock.getsockname()[:2]
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"

    async def __aenter__(self) -> GatewayServer:
        self._task = asyncio.create_task(self._server.serve(sockets=[self._sock]))
        while not self._server.started:
            if self._task.done():
                await self._task  # raises why it could not start
                raise RuntimeError("the gateway server stopped while starting")
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await self._task
        self._sock.close()


@contextlib.asynccontextmanager
async def _store(settings: GatewaySettings) -> AsyncIterator[Store]:
    """The store the session routes read; opened lazily by the store itself, closed at exit."""
    store = open_store(settings.store_url or config.load().store_url)
    try:
        yield store
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def _connected(
    settings: GatewaySettings, stop: asyncio.Event | None
) -> AsyncIterator[tuple[Connection, Topology]]:
    if not settings.nats_url:
        raise ConfigError(NATS_URL.env, "", "the gateway needs a NATS server URL")
    nc = await connect(settings.nats_url, name="tokenwire-gateway", stop=stop)
    try:
        topology = settings.broker_topology
        if settings.provision:
            await ensure_topology(nc, topology)
        else:
            await check_layout(nc, topology)
        yield nc, topology
    finally:
        await nc.close()


async def run(settings: GatewaySettings, stop: asyncio.Event | None = None) -> None:
    """Serve the gateway until ``stop`` is set, or until uvicorn sees SIGINT/SIGTERM
    (``tokenwire gateway``); in-flight steps get ``ack_timeout_s`` to finish.

    Raises :class:`tokenwire.config.ConfigError` for a non-loopback address without gateway
    keys or a missing NATS URL, and ``tokenwire.broker.BrokerUnavailable`` when NATS does
    not answer within ``TOKENWIRE_CONNECT_TIMEOUT_S``.
    """
    check_bind(settings)
    otel = otel_from_env("tokenwire-gateway")  # OTLP export only when an endpoint is set
    async with _connected(settings, stop) as (nc, topology), _store(settings) as store:
        reprovision = (lambda: ensure_topology(nc, topology)) if settings.provision else None
        real = await broker_deps(
            nc,
            topology,
            otel=otel,
            step_retry=(settings.step_retries, settings.step_retry_s),
            claim_idle_s=settings.max_step_idle_seconds + settings.ack_timeout_s,
            reprovision=reprovision,
            store=lambda: store,
        )
        readers = SseStats()
        routes = events_router(
            lambda: nc, topology, lambda: store, stats=readers, max_readers=settings.max_readers
        ).routes
        real.deps = dataclasses.replace(real.deps, extra_routes=routes, store=lambda: store)
        remove = _registered_nothing
        try:
            app = create_app(settings, real.deps)
            gw: Gateway = app.state.gateway
            gw.metrics.watch_readers(readers)
            remove = LEFTOVERS.add("gateway", lambda: _leftovers(gw, real.publisher))
            log.info("%s", gw.keys.summary())
            _reload_keys_on_hangup(gw, settings)
            config = uvicorn.Config(
                app,
                host=settings.host,
                port=settings.port,
                log_level="info",
                lifespan="on",
                access_log=False,
                **_edge_options(settings),
                timeout_graceful_shutdown=_drain_s(settings),
            )
            await _serve(uvicorn.Server(config), stop, on_stop=lambda: _drain_by(gw, settings))
        finally:
            try:
                await real.aclose()
            finally:
                remove()  # what it still left is kept for the stop's report
            otel.shutdown()


def _reload_keys_on_hangup(gw: Gateway, settings: GatewaySettings) -> None:
    """``SIGHUP`` reads the keys file again (:meth:`GatewaySettings.reread_bootstrap`) and, when
    it is valid, the gateway accepts its keys (under the keys bucket's) from the next request
    on, and seeds the bucket with its new names; a bad file changes nothing. Each outcome is
    one log line (names, never keys or hashes)."""

    def reload() -> None:
        try:
            gw.live_keys.reboot(settings.reread_bootstrap())
            ring = gw.keys
        except ConfigError as exc:
            log.error(
                "gateway keys not reloaded (the %d loaded before stay): %s",
                len(gw.keys.names()),
                exc,
            )
            return
        log.info("gateway keys reloaded on SIGHUP: %s", ring.summary())

    with contextlib.suppress(NotImplementedError, AttributeError):  # no SIGHUP on Windows
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)


def _registered_nothing() -> None:
    """The remover before the gateway registered its leftovers."""


CLOSE_RESERVE_S = 8.0
"""What the stop bound keeps for the rest of a stop once the running steps had their time: the
publisher's flush (5 s), the registry and the connections, and the runner's cancel reserve."""


def _drain_s(settings: GatewaySettings) -> int:
    """How long running steps get to finish at a stop: the ack timeout, within the stop bound
    (``TOKENWIRE_STOP_TIMEOUT_S`` less :data:`CLOSE_RESERVE_S`; at least 1 s)."""
    return max(1, int(min(settings.ack_timeout_s, config.stop_timeout() - CLOSE_RESERVE_S)))


def _drain_by(gw: Gateway, settings: GatewaySettings) -> None:
    """From the stop on, uvicorn's graceful wait and the app's drain share one deadline."""
    gw.drain_deadline = time.monotonic() + _drain_s(settings)


def _leftovers(gw: Gateway, publisher: ChunkPublisher) -> str:
    """What stopping now would leave unflushed ("" when nothing), for the stop bound's report."""
    parts = []
    if gw.running_steps:
        parts.append(
            f"{counted(gw.running_steps, 'step')} streaming (their callers' streams end without "
            "their end marker; the request sent again resumes from the broker)"
        )
    in_flight = publisher.stats().in_flight
    if in_flight:
        parts.append(
            f"{counted(in_flight, 'chunk message')} published and not acknowledged (their steps "
            "fail; no caller was told they were captured)"
        )
    return "; ".join(parts)


async def _serve(
    server: uvicorn.Server, stop: asyncio.Event | None, *, on_stop: Callable[[], None]
) -> None:
    """``server.serve()``, asked to exit (gracefully) when ``stop`` is set (``on_stop`` first)."""
    if stop is None:
        await server.serve()
        return

    async def exit_on_stop() -> None:
        await stop.wait()
        on_stop()
        server.should_exit = True

    watcher = asyncio.create_task(exit_on_stop())
    try:
        await server.serve()
    finally:
        watcher.cancel()


def main(settings: GatewaySettings) -> None:
    """Block serving :func:`run` on uvloop (where installed), the loop the gateway is measured
    on.

    uvloop's loop costs a fraction of asyncio's per socket read, write and task switch, which
    the gateway does several of per streamed chunk (docs/gateway-internals.md, "Performance");
    without it (Windows, PyPy) the gateway runs on asyncio's. The process's garbage collector
    runs at :data:`GC_THRESHOLDS`.
    """
    tune_gc()
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        runner.run(run(settings))


def tune_gc() -> None:
    """The gateway process's collector policy (:data:`GC_THRESHOLDS`)."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop where it is installed, else None (asyncio's default)."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop
