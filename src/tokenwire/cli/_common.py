"""What every command shares: settings, the broker URL and the store, the topology, the
session argument, JSON lines. The one home of the CLI's helpers, with ``_running`` (running
until a signal, which needs neither the broker nor the store)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
import shutil
import socket
import sys
import urllib.parse
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import click

from tokenwire.broker import Connection, Topology, connect, free_port, topology_from, valid_session
from tokenwire.cli._errors import UnreachableError, UsageError
from tokenwire.cli._running import run_until_signal, unless_stopped
from tokenwire.config import Settings, connect_timeout, load, without_userinfo
from tokenwire.schemas import json_encoder
from tokenwire.store import Store, StoreError, StoreUnavailable, open_store


def settings(ctx: click.Context) -> Settings:
    """The settings of this invocation (environment, overridden by global flags)."""
    obj = ctx.find_root().obj
    if "settings" not in obj:
        obj["settings"] = load()
    value: Settings = obj["settings"]
    return value


def topology(s: Settings | None = None) -> Topology:
    """The broker topology these settings describe (default: the environment's)."""
    return topology_from(load() if s is None else s)


def port_or_free(host: str, port: int) -> int:
    """``port`` when it can be bound on ``host`` now, else a free one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return free_port()
    return port


def invocation() -> str:
    """How to run tokenwire again from the current directory, as this process was run:
    ``tokenwire`` when that is what the PATH finds, else the script's path (``make demo``'s
    ``.venv/bin/tokenwire``), else ``<python> -m tokenwire``; relative to the current
    directory when below it."""
    script = Path(sys.argv[0])
    if script.name == "tokenwire":
        found = shutil.which("tokenwire")
        if found is not None and Path(found).resolve() == script.resolve():
            return "tokenwire"
        return shlex.quote(_from_here(script))
    return f"{shlex.quote(_from_here(Path(sys.executable)))} -m tokenwire"


def _from_here(path: Path) -> str:
    absolute = path.absolute()
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def nats_url(s: Settings, *, service: bool = False) -> str:
    """The configured NATS URL; else (not for services) the one ``demo``/``up`` recorded.

    Services refuse to start without an explicit URL: guessing would connect a production
    service to whatever a data directory happens to hold.
    """
    if s.nats_url:
        return s.nats_url
    recorded = None if service else s.recorded_nats_url()
    if recorded:
        _check_listening(recorded, s.data_dir)
        return recorded
    if service:
        raise UsageError("TOKENWIRE_NATS_URL is not set")
    raise UsageError(
        "no NATS server: set TOKENWIRE_NATS_URL (or pass --nats-url), or start the embedded "
        f"stack with `tokenwire up` (it records its URL in the data directory {s.data_dir})"
    )


RECORDED_PROBE_S = 1.0
"""How long a read command waits for the recorded embedded server to accept a connection
before it says the stack is stopped (a loopback port answers or refuses at once)."""


def _check_listening(url: str, data_dir: Path) -> None:
    """UnreachableError at once, saying to start ``tokenwire up``, when nothing listens at the
    URL a stopped ``demo``/``up`` recorded (instead of retrying it for the connect timeout)."""
    parts = urllib.parse.urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or 4222), timeout=RECORDED_PROBE_S
        ):
            return
    except OSError:
        pass
    raise UnreachableError(
        "NATS",
        without_userinfo(url),
        f"the stack that `tokenwire demo` or `tokenwire up` started on {data_dir} is not "
        "running; start it again with `tokenwire up` (same data directory), then retry",
    )


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


def resolve_nats_url() -> str:
    """The environment's (or ``--nats-url``'s) URL, else the data dir's record when its server
    answers; UsageError if none, UnreachableError (saying to start ``tokenwire up``) when the
    recorded stack is stopped."""
    return nats_url(load())


def resolve_store_url(flag: str | None = None) -> str:
    """The flag, else ``TOKENWIRE_STORE``, else the data directory's SQLite file."""
    return flag or load().store_url


def checked_session(session: str) -> str:
    if not valid_session(session):
        raise UsageError(
            f"invalid session id {session[:140]!r}: letters, digits, '-', '_' (1 to 128)"
        )
    return session


@asynccontextmanager
async def nats_client(url: str) -> AsyncIterator[Connection]:
    nc = await connect(url, name="tokenwire-cli")
    try:
        yield nc
    finally:
        await nc.close()


@asynccontextmanager
async def opened_store(url: str) -> AsyncIterator[Store]:
    """The store at ``url``, answering within ``TOKENWIRE_CONNECT_TIMEOUT_S``, closed after."""
    store = await ready_store(url, connect_timeout())
    try:
        yield store
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def history_store(url: str) -> AsyncIterator[Store | None]:
    """The store ``replay`` and ``tail`` read the steps gone from the broker from; None when
    there is none to read (a SQLite file that is not there, a URL that does not open): the
    broker alone then, as without a store."""
    if url.startswith("sqlite:///"):
        path = url.removeprefix("sqlite:///").partition("?")[0]
        if not await asyncio.to_thread(Path(path).exists):
            yield None
            return
    try:
        store = open_store(url)
    except StoreError:
        yield None
        return
    try:
        yield store
    finally:
        await store.close()


def write_json(event: object, *, flush: bool = False) -> None:
    out = sys.stdout.buffer
    out.write(json_encoder.encode(event) + b"\n")
    if flush:
        out.flush()
