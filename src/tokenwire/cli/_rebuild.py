"""``tokenwire rebuild [--session S] [--repair]``: the store, rebuilt from the retained stream.

Each session's retained chunks are fed, in stream order, to the assembler's own pure core
(:class:`tokenwire.services.assembler.Assembly`) and committed with the store's idempotent
``commit``: steps already stored stay as they are, and a second run changes nothing. Timing
follows the chunks, not the rebuild's clock; a step still streaming is skipped, never
recorded as abandoned. Sessions the stream no longer retains are named.

``--repair`` also rewrites each stored step that differs from what the broker retains whole
(:meth:`~tokenwire.store.Store.replace_step`, one transaction per step, logged in
``step_repairs``). See docs/replay.md ("Rebuild and repair") and ADR 0034.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import click
import msgspec

from tokenwire.broker import Connection, Topology, connect, retained_sessions
from tokenwire.cli._common import (
    nats_url,
    ready_store,
    settings,
    topology,
)
from tokenwire.cli._errors import CheckFailedError, NotFoundError
from tokenwire.cli._flags import variable_flags
from tokenwire.cli._progress import SessionProgress
from tokenwire.cli._running import run_until_signal, unless_stopped
from tokenwire.replay import Difference, RetainedSteps, compare_with_store, stored_chunks
from tokenwire.schemas import chunk_envelopes
from tokenwire.services.assembler import AssemblerSettings, Assembly, AssemblyConfig, ClosedStep
from tokenwire.store import StepRecord, StepRepair, Store
from tokenwire.variables import NATS_URL

COMMIT_BATCH = 256
REPAIRABLE = frozenset({"outcome", "message", "error", "chunks", "seq-range"})
"""The verify differences a repair rewrites the step for (with the step fully retained)."""


@dataclass
class SessionRebuild:
    """What rebuilding one session did."""

    session: str
    chunks: int = 0
    inserted: int = 0
    already_stored: int = 0
    still_streaming: int = 0
    undecodable: int = 0
    repairs: list[StepRepair] = field(default_factory=list)
    """Steps rewritten by ``--repair``."""
    left: list[Difference] = field(default_factory=list)
    """With ``--repair``: the differences still there after it (none a repair can fix)."""

    @property
    def noteworthy(self) -> bool:
        """Whether its line is printed (it wrote, repaired, skipped or still differs)."""
        return bool(
            self.inserted or self.still_streaming or self.undecodable or self.repairs or self.left
        )


@dataclass
class RebuildReport:
    """What a rebuild did, and which sessions it could not rebuild."""

    sessions: list[SessionRebuild] = field(default_factory=list)
    past_retention: list[str] = field(default_factory=list)


@click.command()
@click.option(
    "--session", "sessions", multiple=True, help="Rebuild only this session (repeatable)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON summary object.")
@click.option("--repair", is_flag=True, help="Also rewrite stored steps that differ from it.")
@variable_flags("rebuild")
@click.pass_context
def rebuild(ctx: click.Context, sessions: tuple[str, ...], as_json: bool, repair: bool) -> None:
    """Rebuild the store from the retained stream (idempotent).

    With --repair, every stored step that differs from what the broker retains is rewritten
    (outcome, chunk log, ledger line; one transaction per step) and printed; exit 1 when a
    difference is left that no repair can fix. SIGINT/SIGTERM stop it between sessions: every
    session it reports is fully committed (and repaired), and running it again writes only
    what a clean rebuild would (exit 130/143).
    """
    s = settings(ctx)
    url = nats_url(s)
    t = topology(s)
    config = _assembly_config(url)
    report = RebuildReport()
    progress = SessionProgress("rebuild")

    async def main(stop: asyncio.Event) -> None:
        nc = await unless_stopped(connect(url, name="tokenwire-rebuild"), stop)
        try:
            store = await unless_stopped(ready_store(s.store_url, s.connect_timeout_s), stop)
            try:
                report.sessions, report.past_retention = await rebuild_store(
                    nc,
                    t,
                    store,
                    list(sessions) or None,
                    config,
                    repair=repair,
                    stop=stop,
                    on_session=progress.advance,
                    on_total=progress.start,
                )
            finally:
                await store.close()
        finally:
            await nc.close()

    try:
        with progress:
            run_until_signal(main, log_level=logging.WARNING)
    finally:
        _print(report, as_json, repair=repair)
    if sessions and not report.sessions:
        raise NotFoundError(f"no retained chunks for {', '.join(sessions)}")
    if report.past_retention and sessions:
        raise CheckFailedError(f"past retention: {', '.join(report.past_retention)}")
    left = sum(len(r.left) for r in report.sessions)
    if left:
        raise CheckFailedError(f"{left} difference(s) left that a repair cannot fix (listed above)")


def _assembly_config(url: str) -> AssemblyConfig:
    """The assembler's own bounds and timeouts, from the same variables it reads."""
    return AssemblerSettings.from_env({**os.environ, NATS_URL.env: url}).assembly


async def rebuild_store(
    nc: Connection,
    t: Topology,
    store: Store,
    only: list[str] | None,
    config: AssemblyConfig,
    *,
    repair: bool = False,
    now: Callable[[], int] = time.time_ns,
    stop: asyncio.Event | None = None,
    on_session: Callable[[SessionRebuild], None] | None = None,
    on_total: Callable[[int], None] | None = None,
) -> tuple[list[SessionRebuild], list[str]]:
    """Rebuild ``only`` these sessions (default: every retained one); name those past retention.

    ``now`` is the clock steps' timeouts are measured against (a step whose last chunk is
    older than its timeout closes as the assembler would have closed it). With ``repair``,
    stored steps that differ from the retained stream are rewritten (see the module). When
    ``stop`` is set the rebuild ends after the session being committed, returning what is
    done so far.
    """
    retained = await retained_sessions(nc, t)
    wanted = [s for s in (only if only is not None else sorted(retained)) if s in retained]
    if on_total is not None:
        on_total(len(wanted))
    rebuilt: list[SessionRebuild] = []
    for session in wanted:
        if stop is not None and stop.is_set():
            return rebuilt, []
        rebuilt.append(await rebuild_session(nc, t, store, session, config, now=now, repair=repair))
        if on_session is not None:
            on_session(rebuilt[-1])
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
    nc: Connection,
    t: Topology,
    store: Store,
    session: str,
    config: AssemblyConfig,
    *,
    now: Callable[[], int] = time.time_ns,
    repair: bool = False,
) -> SessionRebuild:
    """Feed one session's retained chunks through the assembler's core and commit its steps;
    with ``repair``, rewrite the stored steps that differ from the retained chunks."""
    clock = _ChunkClock()
    assembly: Assembly[int] = Assembly(config, clock=clock)
    result = SessionRebuild(session)
    records: list[StepRecord] = []
    retained = RetainedSteps() if repair else None
    async for batch in stored_chunks(nc, t, session):
        for seq, payload in batch:
            try:
                envelopes = chunk_envelopes(payload)
            except (msgspec.DecodeError, msgspec.ValidationError):
                result.chunks += 1
                result.undecodable += 1  # the assembler dead-letters these: nothing to store
                continue
            result.chunks += len(envelopes)
            for envelope in envelopes:  # a frame's chunks share the message's seq as token
                clock.now = envelope.time_ns
                outcome = assembly.feed(envelope, seq)
                if isinstance(outcome, ClosedStep):
                    records.append(outcome.record)
                if retained is not None:
                    retained.add(seq, envelope)
    records += [closed.record for closed in assembly.expire(now())]
    result.still_streaming = assembly.open_steps
    for start in range(0, len(records), COMMIT_BATCH):
        for committed in await store.commit(records[start : start + COMMIT_BATCH]):
            result.inserted += committed.inserted
            result.already_stored += not committed.inserted
    if retained is not None:
        await _repair(store, session, retained, records, result)
    return result


async def _repair(
    store: Store,
    session: str,
    retained: RetainedSteps,
    records: list[StepRecord],
    result: SessionRebuild,
) -> None:
    """Rewrite each stored step whose differences from ``retained`` a repair fixes, with the
    core's record of it (one transaction each); then record what still differs."""
    differences = (await compare_with_store(retained, store, session)).differences
    wrong = _repairable(differences)
    for record in records:
        if (record.turn, record.step) in wrong:
            done = await store.replace_step(record)
            if done is not None and done.replaced:
                result.repairs.append(done)
    if result.repairs:
        differences = (await compare_with_store(retained, store, session)).differences
    result.left = [d for d in differences if d.kind in REPAIRABLE]


def _repairable(differences: list[Difference]) -> set[tuple[int, int]]:
    """The steps with a difference a repair fixes, unless the broker retains only part of
    them (retention removed their start: the stored step is all that is left of it)."""
    partial = {(d.turn, d.step) for d in differences if d.kind == "not-retained"}
    return {(d.turn, d.step) for d in differences if d.kind in REPAIRABLE} - partial


@dataclass
class _ChunkClock:
    """The assembly's clock during a rebuild: the time of the chunk being fed."""

    now: int = 0

    def __call__(self) -> int:
        return self.now


def _print(report: RebuildReport, as_json: bool, *, repair: bool = False) -> None:
    if as_json:
        click.echo(msgspec.json.encode(_summary(report, repair=repair)).decode())
        return
    for r in report.sessions:
        if r.inserted or r.still_streaming or r.undecodable:
            click.echo(_session_line(r))
        for done in r.repairs:
            click.echo(_repair_line(done))
        for difference in r.left:
            click.echo(f"{r.session}: still differs: {difference}")
    for session in report.past_retention:
        click.echo(f"{session}: past retention, cannot be rebuilt (no chunk left on the stream)")
    summary = _summary(report, repair=repair)
    repaired = f"; {summary['repaired']} steps repaired" if repair else ""
    click.echo(
        f"rebuilt {summary['sessions']} sessions: {summary['steps_written']} steps written, "
        f"{summary['already_stored']} already stored, {summary['still_streaming']} still "
        f"streaming, {len(report.past_retention)} past retention{repaired}"
    )


def _repair_line(done: StepRepair) -> str:
    line = (
        f"{done.session}: repaired turn {done.turn} step {done.step}: stored "
        f"{_outcome(done.before_kind, done.before_chunks)} -> "
        f"{_outcome(done.after_kind, done.after_chunks)}"
    )
    if done.moved_steps:
        shift = done.after_chunks - done.before_chunks
        line += f"; {done.moved_steps} later steps moved by {shift:+d} seqs"
    return line


def _outcome(kind: str, chunks: int) -> str:
    return f"{kind} ({chunks} chunk{'' if chunks == 1 else 's'})"


def _session_line(r: SessionRebuild) -> str:
    line = (
        f"{r.session}: {r.chunks} chunks, {r.inserted} steps written, "
        f"{r.already_stored} already stored"
    )
    if r.still_streaming:
        line += f", {r.still_streaming} still streaming (skipped)"
    if r.undecodable:
        line += f", {r.undecodable} undecodable chunks (dead-lettered by the assembler)"
    return line


def _summary(report: RebuildReport, *, repair: bool = False) -> dict[str, object]:
    """The ``--json`` object (also the totals of the text summary)."""
    summary: dict[str, object] = {
        "sessions": len(report.sessions),
        "chunks": sum(r.chunks for r in report.sessions),
        "steps_written": sum(r.inserted for r in report.sessions),
        "already_stored": sum(r.already_stored for r in report.sessions),
        "still_streaming": sum(r.still_streaming for r in report.sessions),
        "undecodable": sum(r.undecodable for r in report.sessions),
        "past_retention": report.past_retention,
        "rebuilt": [
            _session_json(r)
            for r in report.sessions
            if r.inserted or r.still_streaming or r.undecodable
        ],
    }
    if repair:
        summary["repaired"] = sum(len(r.repairs) for r in report.sessions)
        summary["repairs"] = [msgspec.to_builtins(d) for r in report.sessions for d in r.repairs]
        summary["left"] = [
            {"session": r.session, **msgspec.to_builtins(d)}
            for r in report.sessions
            for d in r.left
        ]
    return summary


def _session_json(r: SessionRebuild) -> dict[str, object]:
    """A session's counters (its repairs and differences are listed apart)."""
    fields = dataclasses.asdict(r)
    for name in ("repairs", "left"):
        fields.pop(name)
    return fields
