"""What every command shares: settings, the broker URL, the topology, running until a signal."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import click

from tokenwire.broker import Topology, free_port, topology_from
from tokenwire.cli._errors import Interrupted, UnreachableError, UsageError
from tokenwire.config import Settings, load, without_userinfo
from tokenwire.scrub import install_log_scrubbing
from tokenwire.store import Store, StoreUnavailable, open_store

T = TypeVar("T")


def settings(ctx: click.Context) -> Settings:
    """The settings of this invocation (environment, overridden by global flags)."""
    obj = ctx.find_root().obj
    if "settings" not in obj:
        obj["settings"] = load()
    value: Settings = obj["settings"]
    return value


def topology(s: Settings) -> Topology:
    """The broker topology these settings describe."""
    return topology_from(s)


def port_or_free(host: str, port: int) -> int:
    """``port`` when it can be bound on ``host`` now, else a free one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return free_port()
    return port


def nats_url(s: Settings, *, service: bool = False) -> str:
    """The configured NATS URL; else (not for services) the one ``demo``/``up`` recorded.

    Services refuse to start without an explicit URL: guessing would connect a production
    service to whatever a data directory happens to hold.
    """
    if s.nats_url:
        return s.nats_url
    recorded = None if service else s.recorded_nats_url()
    if recorded:
        return recorded
    hint = "" if service else f" and no URL recorded in {s.data_dir} (run `tokenwire up` first)"
    raise UsageError(f"TOKENWIRE_NATS_URL is not set{hint}")


STOP_GRACE_S = 10.0
"""After SIGINT/SIGTERM a command has this long to stop on its own (commit what it holds,
close); then its task is cancelled. A second signal cancels it at once."""


def run_until_signal(
    main: Callable[[asyncio.Event], Coroutine[Any, Any, None]],
    log_level: int = logging.INFO,
    *,
    grace_s: float = STOP_GRACE_S,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> None:
    """Run ``main(stop)`` on a new event loop; SIGINT and SIGTERM set ``stop``.

    ``main`` stops on its own when ``stop`` is set; past ``grace_s`` it is cancelled. After a
    signal, raises :class:`Interrupted` (exit 130 or 143), also when ``main`` failed on its
    way out (its error is logged).
    """
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    received: list[int] = []
    install_log_scrubbing()

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(main(stop))

        def on_signal(signum: int) -> None:
            if received:
                task.cancel()
                return
            received.append(signum)
            stop.set()
            loop.call_later(grace_s, task.cancel)

        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, on_signal, sig)
        try:
            await task
        except asyncio.CancelledError:
            if not received:
                raise

    try:
        with asyncio.Runner(loop_factory=loop_factory) as loop_runner:
            loop_runner.run(runner())
    except Stopped:
        if not received:
            raise
    except Exception as exc:
        if not received:
            raise
        logging.getLogger("tokenwire").warning("while stopping: %s", without_userinfo(str(exc)))
    if received:
        raise Interrupted(received[0])


async def unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> T:
    """``await work``, unless ``stop`` is set first: then cancel it and raise Stopped."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if not task.done():
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise Stopped
    return task.result()


class Stopped(Exception):  # noqa: N818 - a state
    """A signal asked the command to stop before the awaited work finished."""


def event_loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop where it is installed (Linux, macOS on CPython), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def ready_store(url: str, bound_s: float) -> Store:
    """The store at ``url``, opened and answering within ``bound_s``; else UnreachableError
    (StoreConfigError, exit 2, for a URL that names no usable store)."""
    store, shown = open_store(url), without_userinfo(url)
    try:
        async with asyncio.timeout(bound_s):
            await store.ping()
    except TimeoutError:
        await _close_quietly(store)
        raise UnreachableError("store", shown, f"no answer within {bound_s:g} s") from None
    except StoreUnavailable as exc:
        await _close_quietly(store)
        raise UnreachableError("store", shown, without_userinfo(exc.reason)) from exc
    except BaseException:
        await _close_quietly(store)
        raise
    return store


async def _close_quietly(store: Store) -> None:
    with contextlib.suppress(Exception):
        await store.close()


def run_command(work: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """Run a short command's ``work``: a signal cancels it (exit 130/143)."""

    async def main(stop: asyncio.Event) -> None:
        await unless_stopped(work(), stop)

    run_until_signal(main, log_level=logging.WARNING)
