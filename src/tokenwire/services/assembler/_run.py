"""``run``: the ``tokenwire assembler`` command's body (connect, provision, serve, stop)."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from tokenwire.broker import BrokerError, Connection, check_layout, connect, ended
from tokenwire.config import without_userinfo
from tokenwire.ledger import preload as preload_prices
from tokenwire.leftovers import LEFTOVERS
from tokenwire.observability import OtelProviders, otel_from_env
from tokenwire.services.assembler._errors import AssemblerLoopError, AssemblerStartError
from tokenwire.services.assembler._gc import tune_gc
from tokenwire.services.assembler._metrics import ProbeServer, probe_app
from tokenwire.services.assembler._provision import provision
from tokenwire.services.assembler._service import Assembler
from tokenwire.services.assembler._settings import AssemblerSettings
from tokenwire.store import Store, StoreError, StoreUnavailable, open_store

log = logging.getLogger(__name__)

BURST_POLL_S = 0.1


async def run(
    settings: AssemblerSettings,
    stop: asyncio.Event | None = None,
    *,
    store: Store | None = None,
    otel: OtelProviders | None = None,
) -> Assembler:
    """Run one assembler instance until ``stop`` is set (or, with ``settings.burst``, until
    the stream is drained and every closed step is committed). Returns the stopped instance
    (its ``metrics`` hold the counts).

    ``store`` overrides ``settings.store_url`` (tests wrap a store to inject outages); it is
    then not closed here; ``otel`` overrides the providers made from the ``OTEL_*`` variables
    (and is then not shut down here). Raises AssemblerStartError when the broker, the topology
    or the metrics address is unusable, or when the broker or the store does not answer within
    ``settings.start_timeout_s`` at start (a store going down later is waited for).
    """
    stop = stop or asyncio.Event()
    nc = await _connect(settings, stop)
    owned_store = store is None
    the_store = store if store is not None else _open(settings)
    server: ProbeServer | None = None
    owned_otel = otel is None
    otel = otel or otel_from_env("tokenwire-assembler")  # OTLP only when an endpoint is set
    try:
        await _prepare(settings, nc, the_store, stop)
        assembler = Assembler(settings, nc, the_store, otel=otel)
        if settings.tune_gc:
            tune_gc()
        server = _serve_probes(settings, assembler)
        remove = LEFTOVERS.add("assembler", assembler.leftovers)
        try:
            await assembler.start()
            try:
                await _wait(assembler, stop)
            except AssemblerLoopError:
                await _close_logged(assembler)  # the loop's end is the error to report
                raise
            except BaseException:
                await assembler.close()
                raise
            await assembler.close()
        finally:
            remove()  # what it still left is kept for the stop's report
        return assembler
    finally:
        if server is not None:
            server.close()
        if owned_otel:
            otel.shutdown()
        if owned_store:
            await the_store.close()
        with contextlib.suppress(OSError):
            await nc.close()


async def _connect(settings: AssemblerSettings, stop: asyncio.Event) -> Connection:
    try:
        return await connect(
            list(settings.nats_urls),
            name=settings.name,
            first_connect_s=settings.start_timeout_s,
            stop=stop,
        )
    except BrokerError as exc:
        raise AssemblerStartError("broker", str(exc)) from exc


def _open(settings: AssemblerSettings) -> Store:
    try:
        return open_store(settings.store_url)
    except StoreError as exc:
        raise AssemblerStartError("store", str(exc)) from exc


async def _prepare(
    settings: AssemblerSettings, nc: Connection, store: Store, stop: asyncio.Event
) -> None:
    try:
        if settings.provision:
            await provision(nc, settings)
        else:
            await check_layout(nc, settings.topology)
    except BrokerError as exc:
        raise AssemblerStartError("topology", str(exc)) from exc
    # The price data loads (~0.7 s, once) while the store is awaited, not in the first commit.
    await asyncio.gather(asyncio.to_thread(preload_prices), _wait_for_store(settings, store, stop))


async def _wait_for_store(settings: AssemblerSettings, store: Store, stop: asyncio.Event) -> None:
    """Ping the store until it answers (bounded back-off) or ``stop`` is set; past
    ``settings.start_timeout_s`` AssemblerStartError naming the store and the last cause."""
    delay = settings.backoff_initial_s
    deadline = asyncio.get_running_loop().time() + settings.start_timeout_s
    cause = "no answer"
    while not stop.is_set():
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            where = without_userinfo(settings.store_url)
            raise AssemblerStartError(
                "store", f"not reachable at {where} within {settings.start_timeout_s:g} s: {cause}"
            )
        try:
            async with asyncio.timeout(left):
                await store.ping()
            return
        except TimeoutError:
            continue
        except StoreUnavailable as exc:
            cause = without_userinfo(str(exc))
            log.warning("store not reachable yet: %s", cause)
        except StoreError as exc:
            raise AssemblerStartError("store", str(exc)) from exc
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), min(delay, max(left, 0.01)))
        delay = min(delay * 2, settings.backoff_max_s)


def _serve_probes(settings: AssemblerSettings, assembler: Assembler) -> ProbeServer | None:
    if settings.metrics_addr is None:
        return None
    host, port = settings.metrics_addr
    try:
        server = ProbeServer(host, port, probe_app(assembler.metrics.registry, assembler.probe))
    except OSError as exc:
        raise AssemblerStartError("metrics", f"cannot listen on {host}:{port}: {exc}") from exc
    log.info("assembler metrics on http://%s:%d/metrics", host, server.port)
    return server


def _check_loops(assembler: Assembler) -> None:
    """Raise AssemblerLoopError when a background loop of the instance ended (they run until
    it closes: an end is an error they let out, or a bug)."""
    if (end := ended(assembler.loops)) is not None:
        name, reason, exc = end
        raise AssemblerLoopError(name, reason) from exc


async def _close_logged(assembler: Assembler) -> None:
    """Close after a background loop ended; what closing could not do is logged."""
    try:
        await assembler.close()
    except Exception:
        log.exception("the assembler did not close cleanly after its loop ended")


async def _wait(assembler: Assembler, stop: asyncio.Event) -> None:
    """Until ``stop`` (or a burst's end); raises AssemblerLoopError as soon as one of the
    instance's background loops ended."""
    if not assembler.settings.burst:
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([stopped, *assembler.loops], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        _check_loops(assembler)
        return
    idle_rounds = 0
    while not stop.is_set() and idle_rounds < 2:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), BURST_POLL_S)
        _check_loops(assembler)
        idle_rounds = idle_rounds + 1 if await assembler.drained() else 0
