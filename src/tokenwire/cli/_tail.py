"""``tokenwire tail``: follow a session live, resuming from a stream sequence."""

from __future__ import annotations

import contextlib
import sys

import click

from tokenwire.cli._common import (
    checked_session,
    history_store,
    nats_client,
    resolve_nats_url,
    resolve_store_url,
    run_command,
    topology,
    write_json,
)
from tokenwire.cli._flags import variable_flags
from tokenwire.config import without_userinfo
from tokenwire.replay import EventPrinter, read_session


@click.command()
@click.argument("session")
@click.option("--from-seq", type=click.IntRange(min=1), help="First stream seq to show.")
@click.option("--json", "as_json", is_flag=True, help="Print the events as JSONL (with seq).")
@variable_flags("tail")
def tail(session: str, from_seq: int | None, as_json: bool) -> None:
    """Follow SESSION live until Ctrl-C; print how to resume (--from-seq) when stopped.

    Every JSON line carries its ``seq`` (and ``index``, ``last`` inside a frame of chunks): a
    killed tail resumes exactly with ``--from-seq <seq + 1>`` of the last line whose ``last``
    is true. The text view prints the resume seq after each step.
    Ctrl-C (exit 130) and SIGTERM (exit 143) print the resume point.
    """
    checked_session(session)
    url = resolve_nats_url()
    store_url = resolve_store_url()
    position = _Position(from_seq or 1)
    try:
        run_command(lambda: _tail(url, store_url, session, position, as_json))
    finally:
        click.echo(
            f"tail stopped; resume with: tokenwire tail {session} --from-seq {position.next_seq}",
            err=True,
        )


class _Position:
    """The next stream seq the tail would show (the resume point)."""

    def __init__(self, next_seq: int) -> None:
        self.next_seq = next_seq


async def _tail(url: str, store_url: str, session: str, position: _Position, as_json: bool) -> None:
    printer = None if as_json else EventPrinter(sys.stdout)
    t = topology()
    shown = without_userinfo(url)
    click.echo(
        f"tailing {session} on {shown} from stream seq {position.next_seq}; Ctrl-C to stop",
        err=True,
    )
    try:
        async with nats_client(url) as nc, history_store(store_url) as store:
            events = read_session(nc, t, session, position.next_seq, follow=True, store=store)
            async with contextlib.aclosing(events):
                async for event in events:
                    if printer is None:
                        write_json(event, flush=True)
                    else:
                        printer.print(event)
                        sys.stdout.flush()
                    # inside a frame the message is not done: resuming repeats, never misses
                    # (the store's part, steps gone from the broker, is read again from 1)
                    position.next_seq = max(1, event.seq + 1 if event.last else event.seq)
    finally:
        if printer is not None:
            printer.close()
