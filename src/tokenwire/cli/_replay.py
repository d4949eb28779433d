"""``tokenwire replay``: a session as the user saw it, from the broker's retained stream.

Also the pieces the other read-side commands (``tail``, ``messages``, ``status``) share:
where the NATS server and the store are, and the topology.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import click

from tokenwire.broker import Connection, Topology, connect, topology_from, valid_session
from tokenwire.cli._common import ready_store, run_command
from tokenwire.cli._errors import CheckFailedError, NotFoundError, UsageError
from tokenwire.cli._flags import variable_flags
from tokenwire.config import connect_timeout, load
from tokenwire.replay import (
    EventPrinter,
    ReplayEvent,
    SessionNotFound,
    paced,
    read_session,
    verify_report,
)
from tokenwire.schemas import json_encoder
from tokenwire.store import Store

F = TypeVar("F", bound=Callable[..., Any])


def resolve_nats_url(flag: str | None = None) -> str:
    """The flag, else the environment, else the data dir's record; UsageError if none."""
    if flag:
        return flag
    settings = load()
    url = settings.nats_url or settings.recorded_nats_url()
    if url is None:
        raise UsageError(
            "no NATS server: pass --nats-url or set TOKENWIRE_NATS_URL (or run "
            f"`tokenwire up` with data directory {settings.data_dir} first)"
        )
    return url


def resolve_store_url(flag: str | None = None) -> str:
    """The flag, else ``TOKENWIRE_STORE``, else the data directory's SQLite file."""
    return flag or load().store_url


def topology() -> Topology:
    """The topology the services use (``TOKENWIRE_PARTITIONS``, ``TOKENWIRE_SHARDS``, ...)."""
    return topology_from(load())


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


def write_json(event: object, *, flush: bool = False) -> None:
    out = sys.stdout.buffer
    out.write(json_encoder.encode(event) + b"\n")
    if flush:
        out.flush()


@click.command()
@click.argument("sessions", metavar="SESSION...", nargs=-1, required=True)
@click.option("--from-seq", type=click.IntRange(min=1), help="First stream seq to show.")
@click.option("--speed", type=click.FloatRange(min=0, min_open=True), help="Timing factor.")
@click.option("--max", "fastest", is_flag=True, help="As fast as possible (no timing).")
@click.option("--verify", "check", is_flag=True, help="Compare with the store; exit 1 on a diff.")
@click.option("--json", "as_json", is_flag=True, help="Print the events (or differences) as JSONL.")
@variable_flags("replay")
def replay(
    sessions: tuple[str, ...],
    from_seq: int | None,
    speed: float | None,
    fastest: bool,
    check: bool,
    as_json: bool,
) -> None:
    """Show SESSION as the user saw it, from the broker, with its original timing.

    With --verify, several sessions may be named: each is compared with the store, with a
    progress display on a terminal and one summary (one JSON object with --json).
    """
    if speed is not None and fastest:
        raise UsageError("--speed and --max exclude each other")
    if check and (from_seq is not None or speed is not None or fastest):
        # verify always compares whole sessions, unpaced: a flag it would ignore is refused
        raise UsageError(
            "--verify compares whole sessions: --from-seq, --speed and --max do not apply to it"
        )
    for one in sessions:
        checked_session(one)
    url = resolve_nats_url()
    if check and len(sessions) > 1:
        from tokenwire.cli._verify_many import verify_sessions

        verify_sessions(url, resolve_store_url(), list(sessions), as_json)
        return
    if len(sessions) > 1:
        raise UsageError("only --verify takes more than one session")
    [session] = sessions
    if check:
        store_url = resolve_store_url()
        run_command(lambda: _verify(url, store_url, session, as_json))
        return
    pace = None if fastest else (speed or 1.0)
    run_command(lambda: _replay(url, session, from_seq, pace, as_json))


async def _replay(
    url: str, session: str, from_seq: int | None, speed: float | None, as_json: bool
) -> None:
    t = topology()
    printer = None if as_json else EventPrinter(sys.stdout)
    shown = 0
    async with nats_client(url) as nc:
        async for event in paced(read_session(nc, t, session, from_seq), speed):
            shown += 1
            _emit(event, printer)
        if printer is not None:
            printer.close()
        if shown == 0 and (from_seq is None or not await _exists(nc, t, session)):
            raise NotFoundError(str(SessionNotFound(session, t.stream_of(session))) + f" at {url}")


def _emit(event: ReplayEvent, printer: EventPrinter | None) -> None:
    if printer is None:
        write_json(event)
    else:
        printer.print(event)


async def _exists(nc: Connection, t: Topology, session: str) -> bool:
    async with contextlib.aclosing(read_session(nc, t, session)) as events:
        async for _ in events:
            return True
    return False


async def _verify(url: str, store_url: str, session: str, as_json: bool) -> None:
    async with nats_client(url) as nc, opened_store(store_url) as store:
        try:
            report = await verify_report(nc, topology(), store, session)
        except SessionNotFound as exc:
            raise NotFoundError(f"{exc} nor in the store {store.url}") from exc
    for difference in report.differences:
        if as_json:
            write_json(difference)
        else:
            click.echo(str(difference))
    if report.differences:
        raise CheckFailedError(
            f"{len(report.differences)} difference(s) between the store and the retained "
            f"stream of {session}"
        )
    if not as_json:
        click.echo(
            f"verified {session}: {report.steps} steps, {report.chunks} retained chunks, "
            "no differences"
        )
