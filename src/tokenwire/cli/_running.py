"""Running a command until SIGINT or SIGTERM, within the stop bound: the signal handlers, the
cancel before the bound, the watchdog at it and the leftovers each logs.

It imports neither the broker nor the store (nor nats): a command that needs neither, like
``tokenwire scripted-provider``, starts without paying for them (``_common`` has the helpers
that do need them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from tokenwire.cli._errors import Interrupted
from tokenwire.config import stop_timeout, without_userinfo
from tokenwire.leftovers import LEFTOVERS
from tokenwire.scrub import install_log_scrubbing

T = TypeVar("T")


CANCEL_RESERVE_S = 2.0
"""After SIGINT/SIGTERM a command stops on its own (commits what it holds, closes); this long
before the stop bound its task is cancelled, and at the bound the process exits whatever it
is doing (a quarter of the bound when that is shorter)."""


def run_until_signal(
    main: Callable[[asyncio.Event], Coroutine[Any, Any, None]],
    log_level: int = logging.INFO,
    *,
    stop_timeout_s: float | None = None,
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None,
) -> None:
    """Run ``main(stop)`` on a new event loop; SIGINT and SIGTERM set ``stop``.

    ``main`` stops on its own when ``stop`` is set. The stop is bounded by ``stop_timeout_s``
    (default ``TOKENWIRE_STOP_TIMEOUT_S``), whether or not the broker and the store answer:
    :data:`CANCEL_RESERVE_S` before the bound ``main`` is cancelled, and at the bound a
    watchdog thread exits the process (128 + the signal), each time logging what the
    process's parts leave unflushed (:data:`tokenwire.leftovers.LEFTOVERS`). A second signal
    cancels at once. After a signal, raises :class:`Interrupted` (exit 130 or 143), also when
    ``main`` failed on its way out (its error is logged).
    """
    logging.basicConfig(level=log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    received: list[int] = []
    install_log_scrubbing()
    bound = stop_timeout_s if stop_timeout_s is not None else stop_timeout()

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
            loop.call_later(bound - min(CANCEL_RESERVE_S, bound / 4), _cut, task, bound)
            _exit_at_the_bound(bound, signum)

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
        _log_leftovers(logging.getLogger("tokenwire"), quiet=True)
        raise Interrupted(received[0])


def _cut(task: asyncio.Future[None], bound: float) -> None:
    """The graceful stop ran out of time: say what is left, cancel the command."""
    if task.done():
        return
    log = logging.getLogger("tokenwire")
    log.warning(
        "stop not finished %g s before its bound of %g s: cancelling it",
        min(CANCEL_RESERVE_S, bound / 4),
        bound,
    )
    _log_leftovers(log)
    task.cancel()


def _exit_at_the_bound(bound: float, signum: int) -> None:
    """A daemon thread that exits the process at the bound: the event loop (blocked, or
    waiting on a thread pool at exit) may never get back to it."""

    def exit_now() -> None:
        log = logging.getLogger("tokenwire")
        log.error("not stopped %g s after %s: exiting now", bound, signal.Signals(signum).name)
        _log_leftovers(log)
        sys.stderr.write(f"tokenwire: stopped by {signal.Signals(signum).name}\n")
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        sys.stderr.flush()
        os._exit(128 + signum)

    watchdog = threading.Timer(bound, exit_now)
    watchdog.daemon = True
    watchdog.start()


def _log_leftovers(log: logging.Logger, *, quiet: bool = False) -> None:
    """One line per part that left something; ``quiet``: nothing when none did."""
    lines = LEFTOVERS.lines()
    for line in lines:
        log.warning("left unflushed: %s (nothing acknowledged is lost)", line)
    if not lines and not quiet:
        log.warning(
            "left unflushed: nothing any part reported (what was not acknowledged is redelivered)"
        )


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
