"""Plain JetStream API requests, for what nats-py's typed API cannot express.

nats-py 2.16 has no priority-group fields on ``ConsumerConfig`` and no subject transform on a
stream create it validates; the server accepts both as JSON, so provisioning and the grouped
pull loop speak the JSON API directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any, TypeAlias

import msgspec
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError, NoServersError
from nats.errors import TimeoutError as NatsTimeoutError

from tokenwire import config
from tokenwire.broker._errors import BrokerUnavailable
from tokenwire.scrub import register_urls

log = logging.getLogger(__name__)

Connection: TypeAlias = Client
"""A connection to the broker, as :func:`connect` returns it. Services hold it and hand it to
this package's operations; only this package calls its methods beyond ``is_connected``,
``is_closed``, ``drain`` and ``close``."""

NS = 1_000_000_000
"""Nanoseconds per second: JetStream durations are integers in ns."""

STREAM_NAME_IN_USE = 10058
STREAM_NOT_FOUND = 10059
CONSUMER_NOT_FOUND = 10014
DEFAULT_INBOX = "_INBOX"


class ApiError(Exception):
    """A JetStream API error response (internal: callers translate it to a typed leaf)."""

    def __init__(self, subject: str, code: int, err_code: int, description: str) -> None:
        self.subject = subject
        self.code = code
        self.err_code = err_code
        self.description = description
        super().__init__(f"{subject}: {code}/{err_code} {description}")


async def api_request(
    nc: Client, subject: str, body: dict[str, Any] | None = None, timeout_s: float = 5.0
) -> dict[str, Any]:
    """Send one ``$JS.API...`` request and return the decoded reply; ApiError on an error reply."""
    payload = msgspec.json.encode(body) if body is not None else b""
    try:
        reply = await nc.request(subject, payload, timeout=timeout_s)
    except (NatsTimeoutError, NoRespondersError) as exc:
        raise ApiError(subject, 503, 0, f"no answer: {type(exc).__name__}") from exc
    data: dict[str, Any] = msgspec.json.decode(reply.data) if reply.data else {}
    error = data.get("error")
    if error is not None:
        raise ApiError(
            subject, int(error.get("code", 0)), int(error.get("err_code", 0)), error["description"]
        )
    return data


def server_url(nc: Client) -> str:
    """The URL of the server ``nc`` is connected to, for errors (``nats://?`` when none)."""
    server = nc.connected_url
    return server.geturl() if server is not None else "nats://?"


def split_urls(urls: str | Sequence[str]) -> list[str]:
    """``"a,b"`` or ``["a", "b"]`` -> a list of server URLs."""
    if isinstance(urls, str):
        return [u.strip() for u in urls.split(",") if u.strip()]
    return list(urls)


async def connect(
    urls: str | Sequence[str],
    *,
    name: str = "tokenwire",
    connect_timeout: float = 2.0,
    pending_size: int = 8 * 1024 * 1024,
    first_connect_s: float | None = None,
    stop: asyncio.Event | None = None,
) -> Client:
    """Connect to NATS; BrokerUnavailable when no server answered within ``first_connect_s``.

    The first connect retries the servers for at most ``first_connect_s`` seconds (default
    ``TOKENWIRE_CONNECT_TIMEOUT_S``, 5 s), then fails naming the URLs (without credentials)
    and the last cause; once connected, the client reconnects without end (each attempt
    bounded by ``connect_timeout``). A ``stop`` set meanwhile (a signal) ends the attempt at
    once, also with BrokerUnavailable. ``pending_size`` bounds what nats-py buffers while
    disconnected; past it publishes fail fast with OutboundBufferLimitError, which the
    publisher treats as a retryable send.
    """
    servers = split_urls(urls)
    bound = config.connect_timeout() if first_connect_s is None else first_connect_s
    register_urls(servers)  # their passwords are scrubbed from whatever this process reports
    shown = config.without_userinfo(",".join(servers))
    log.info("connecting to %s (first connect within %g s)", shown, bound)
    nc = Client()
    attempt = nc.connect(
        servers=servers,
        name=name,
        connect_timeout=int(max(1, min(connect_timeout, bound))),
        allow_reconnect=True,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,  # type: ignore[arg-type]  # a float works; the stub says int
        pending_size=pending_size,
        error_cb=_ignore_error,
        inbox_prefix=inbox_prefix(servers),
    )
    try:
        outcome = await _attempt(attempt, bound, stop)
    except BaseException:
        await _abandon(nc)
        raise
    if outcome is None:
        return nc
    await _abandon(nc)
    if isinstance(outcome, _StoppedError):
        raise BrokerUnavailable(shown, "stopped while connecting")
    raise BrokerUnavailable(shown, _cause(nc, outcome, bound)) from outcome


class _StoppedError(Exception):
    """``stop`` was set before the connect finished."""


async def _attempt(
    work: Coroutine[Any, Any, None], bound: float, stop: asyncio.Event | None
) -> BaseException | None:
    """Run ``work`` for at most ``bound`` seconds or until ``stop``; None when it succeeded,
    else why not (TimeoutError past the bound). A caller's cancellation propagates."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(stop.wait()) if stop is not None else None
    try:
        await asyncio.wait(
            {task} | ({waiter} if waiter else set()),
            timeout=bound,
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        if waiter is not None:
            waiter.cancel()
        await cancel_task(task)
    if not task.done() or task.cancelled():
        return _StoppedError() if stop is not None and stop.is_set() else TimeoutError()
    exc = task.exception()
    if exc is None or isinstance(exc, NoServersError | OSError | TimeoutError | NatsError):
        return exc
    raise exc


async def cancel_task(task: asyncio.Future[Any], attempts: int = 20) -> None:
    """Cancel ``task`` and wait for it, cancelling again while it goes on (bounded: at most
    ``attempts`` tries of 0.1 s). On Python 3.11 an ``asyncio.wait_for`` that races its own
    result can swallow a cancellation (nats-py's connect loop and request do), and a plain
    ``cancel(); await task`` then waits for ever."""
    for _ in range(attempts):
        if task.done():
            return
        task.cancel()
        await asyncio.wait({task}, timeout=0.1)


def ended(tasks: Iterable[asyncio.Task[Any]]) -> tuple[str, str, BaseException | None] | None:
    """The first of ``tasks`` (loops meant to run until they are stopped) that ended: its
    name, why (the error it let out, "cancelled" or "returned") and the error; None while
    every one runs."""
    for task in tasks:
        if task.done():
            if task.cancelled():
                return task.get_name(), "cancelled", None
            exc = task.exception()
            return task.get_name(), repr(exc) if exc else "returned", exc
    return None


def _cause(nc: Client, exc: BaseException, bound: float) -> str:
    """What the last attempt failed with (nats-py keeps it as ``last_error``)."""
    last = nc.last_error if isinstance(exc, TimeoutError) else exc
    what = f"{type(last).__name__}: {last}" if last is not None and str(last) else ""
    what = what or (type(last).__name__ if last is not None else "")
    within = f"no connection within {bound:g} s"
    return config.without_userinfo(f"{within} ({what})" if what else within)


async def _abandon(nc: Client) -> None:
    """Stop a client whose first connect failed (its reconnect loop, its sockets)."""
    with contextlib.suppress(Exception):
        await nc.close()


def inbox_prefix(servers: Sequence[str]) -> str:
    """``_INBOX.<user>`` for a URL with a user (``nats://gateway:pw@host``), else ``_INBOX``.

    Each deployed user may subscribe to its own inboxes only (deploy/nats/accounts.conf), so
    it cannot read the replies and ordered-consumer deliveries of another user.
    """
    for url in servers:
        user = urllib.parse.urlsplit(url if "://" in url else f"nats://{url}").username
        if user:
            return f"{DEFAULT_INBOX}.{urllib.parse.unquote(user)}"
    return DEFAULT_INBOX


async def _ignore_error(exc: Exception) -> None:
    """Reconnects and slow-consumer notices are expected; the typed paths surface real failures."""
