"""``tokenwire rebuild [--session S]``: the store, rebuilt from the broker's retained stream.

Each session's retained chunks are read in stream order and fed to the assembler's own pure
core (:class:`tokenwire.services.assembler.Assembly`), so a rebuilt step is folded, closed and
numbered exactly as the assembler does it; the records are committed with the store's
idempotent ``commit``, so steps already stored are left as they are and running rebuild twice
changes nothing. Into an empty store, the result equals the assembler's store for every step
that closed complete (steps closed by a timeout depend on when the timeout fired).

Timing follows the chunks, not the clock of the rebuild: a step whose last chunk is older than
the assembler's gap/abandon timeout is closed as the assembler would have closed it; a step
still streaming is skipped (reported), so a rebuild never records a live step as abandoned.
Sessions the store has and the stream no longer retains cannot be rebuilt and are named.
"""

from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass, field

import click
import msgspec
from nats.aio.client import Client

from tokenwire.broker import Topology, connect, retained_sessions
from tokenwire.cli._common import nats_url, run_until_signal, settings, topology
from tokenwire.cli._errors import CheckFailedError, NotFoundError
from tokenwire.replay import stored_chunks
from tokenwire.schemas import envelope_decoder
from tokenwire.services.assembler import AssemblerSettings, Assembly, AssemblyConfig, ClosedStep
from tokenwire.store import StepRecord, Store, open_store

COMMIT_BATCH = 256


@dataclass
class SessionRebuild:
    """What rebuilding one session did."""

    session: str
    chunks: int = 0
    inserted: int = 0
    already_stored: int = 0
    still_streaming: int = 0
    undecodable: int = 0


@dataclass
class RebuildReport:
    """What a rebuild did, and which sessions it could not rebuild."""

    sessions: list[SessionRebuild] = field(default_factory=list)
    past_retention: list[str] = field(default_factory=list)


@click.command()
@click.option(
    "--session", "sessions", multiple=True, help="Rebuild only this session (repeatable)."
)
@click.pass_context
def rebuild(ctx: click.Context, sessions: tuple[str, ...]) -> None:
    """Rebuild the store from the retained stream (idempotent)."""
    s = settings(ctx)
    url = nats_url(s)
    t = topology(s)
    config = _assembly_config(url)
    report = RebuildReport()

    async def main(_stop: asyncio.Event) -> None:
        nc = await connect(url, name="tokenwire-rebuild")
        store = open_store(s.store_url)
        try:
            report.sessions, report.past_retention = await rebuild_store(
                nc, t, store, list(sessions) or None, config
            )
        finally:
            await store.close()
            await nc.close()

    run_until_signal(main)
    _print(report)
    if sessions and not report.sessions:
        raise NotFoundError(f"no retained chunks for {', '.join(sessions)}")
    if report.past_retention and sessions:
        raise CheckFailedError(f"past retention: {', '.join(report.past_retention)}")


def _assembly_config(url: str) -> AssemblyConfig:
    """The assembler's own bounds and timeouts, from the same variables it reads."""
    return AssemblerSettings.from_env({**os.environ, "TOKENWIRE_NATS_URL": url}).assembly


async def rebuild_store(
    nc: Client, t: Topology, store: Store, only: list[str] | None, config: AssemblyConfig
) -> tuple[list[SessionRebuild], list[str]]:
    """Rebuild ``only`` these sessions (default: every retained one); name those past retention."""
    retained = await retained_sessions(nc, t)
    wanted = only if only is not None else sorted(retained)
    rebuilt = [await rebuild_session(nc, t, store, s, config) for s in wanted if s in retained]
    if only is not None:
        return rebuilt, [s for s in only if s not in retained]
    return rebuilt, sorted(await _stored_sessions(store) - retained)


async def _stored_sessions(store: Store, page: int = 10_000) -> set[str]:
    """Every session the store holds, read a page at a time."""
    sessions: set[str] = set()
    offset = 0
    while True:
        batch = await store.sessions(limit=page, offset=offset)
        sessions.update(summary.session for summary in batch)
        if len(batch) < page:
            return sessions
        offset += page


async def rebuild_session(
    nc: Client, t: Topology, store: Store, session: str, config: AssemblyConfig
) -> SessionRebuild:
    """Feed one session's retained chunks through the assembler's core and commit its steps."""
    clock = _ChunkClock()
    assembly: Assembly[int] = Assembly(config, clock=clock)
    result = SessionRebuild(session)
    records: list[StepRecord] = []
    async for batch in stored_chunks(nc, t, session):
        for seq, payload in batch:
            result.chunks += 1
            try:
                envelope = envelope_decoder.decode(payload)
            except (msgspec.DecodeError, msgspec.ValidationError):
                result.undecodable += 1  # the assembler dead-letters these: nothing to store
                continue
            clock.now = envelope.time_ns
            outcome = assembly.feed(envelope, seq)
            if isinstance(outcome, ClosedStep):
                records.append(outcome.record)
    records += [closed.record for closed in assembly.expire(time.time_ns())]
    result.still_streaming = assembly.open_steps
    for start in range(0, len(records), COMMIT_BATCH):
        for committed in await store.commit(records[start : start + COMMIT_BATCH]):
            result.inserted += committed.inserted
            result.already_stored += not committed.inserted
    return result


@dataclass
class _ChunkClock:
    """The assembly's clock during a rebuild: the time of the chunk being fed."""

    now: int = 0

    def __call__(self) -> int:
        return self.now


def _print(report: RebuildReport) -> None:
    for r in report.sessions:
        line = (
            f"{r.session}: {r.chunks} chunks, {r.inserted} steps written, "
            f"{r.already_stored} already stored"
        )
        if r.still_streaming:
            line += f", {r.still_streaming} still streaming (skipped)"
        if r.undecodable:
            line += f", {r.undecodable} undecodable chunks (dead-lettered by the assembler)"
        click.echo(line)
    for session in report.past_retention:
        click.echo(f"{session}: past retention, cannot be rebuilt (no chunk left on the stream)")
    written = sum(r.inserted for r in report.sessions)
    kept = sum(r.already_stored for r in report.sessions)
    click.echo(
        f"rebuilt {len(report.sessions)} sessions: {written} steps written, {kept} already "
        f"stored, {len(report.past_retention)} past retention"
    )
