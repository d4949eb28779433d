"""``tokenwire replay``: a session as the user saw it, from the broker's retained stream (the
steps it no longer retains from the store's chunk log)."""

from __future__ import annotations

import contextlib
import sys

import click

from tokenwire.broker import Connection, Topology
from tokenwire.cli._common import (
    checked_session,
    history_store,
    nats_client,
    opened_store,
    resolve_nats_url,
    resolve_store_url,
    run_command,
    topology,
    write_json,
)
from tokenwire.cli._errors import CheckFailedError, NotFoundError, UsageError
from tokenwire.cli._flags import variable_flags
from tokenwire.replay import (
    EventPrinter,
    ReplayEvent,
    SessionNotFound,
    paced,
    read_session,
    verify_report,
)


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
    store_url = resolve_store_url()
    run_command(lambda: _replay(url, store_url, session, from_seq, pace, as_json))


async def _replay(
    url: str,
    store_url: str,
    session: str,
    from_seq: int | None,
    speed: float | None,
    as_json: bool,
) -> None:
    t = topology()
    printer = None if as_json else EventPrinter(sys.stdout)
    shown = 0
    async with nats_client(url) as nc, history_store(store_url) as store:
        events = read_session(nc, t, session, from_seq, store=store)
        async for event in paced(events, speed):
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
