"""``tokenwire replay S1 S2 ... --verify``: many sessions compared with the store, with progress.

Each session is verified as ``replay S --verify`` does it (:func:`tokenwire.replay.verify_report`);
the sessions share one broker connection and one store. SIGINT/SIGTERM stop between sessions
(exit 130/143) after printing what was verified so far.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

import click
import msgspec

from tokenwire.cli._common import (
    nats_client,
    opened_store,
    topology,
)
from tokenwire.cli._errors import CheckFailedError, NotFoundError
from tokenwire.cli._progress import SessionProgress
from tokenwire.cli._running import run_until_signal, unless_stopped
from tokenwire.replay import Difference, SessionNotFound, verify_report


@dataclass
class SessionVerified:
    """One session's verification."""

    session: str
    steps: int = 0
    chunks: int = 0
    differences: list[Difference] = field(default_factory=list)


@dataclass
class VerifySummary:
    verified: list[SessionVerified] = field(default_factory=list)
    not_found: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "sessions": len(self.verified),
            "steps": sum(v.steps for v in self.verified),
            "chunks": sum(v.chunks for v in self.verified),
            "differences": [
                {"session": v.session, **msgspec.to_builtins(d)}
                for v in self.verified
                for d in v.differences
            ],
            "not_found": self.not_found,
        }


def verify_sessions(url: str, store_url: str, sessions: list[str], as_json: bool) -> None:
    """Verify every session; exit 1 when any differs or is not found."""
    summary = VerifySummary()
    progress = SessionProgress("verify")

    async def main(stop: asyncio.Event) -> None:
        async with nats_client(url) as nc, opened_store(store_url) as store:
            progress.start(len(sessions))
            for session in sessions:
                if stop.is_set():
                    return
                try:
                    report = await unless_stopped(
                        verify_report(nc, topology(), store, session), stop
                    )
                except SessionNotFound:
                    summary.not_found.append(session)
                    progress.advance(SessionVerified(session))
                    continue
                done = SessionVerified(session, report.steps, report.chunks, report.differences)
                summary.verified.append(done)
                progress.advance(done)

    try:
        with progress:
            run_until_signal(main, log_level=logging.WARNING)
    finally:
        _print(summary, as_json)
    differing = [v.session for v in summary.verified if v.differences]
    if differing:
        names = ", ".join(differing)
        raise CheckFailedError(f"differences in {len(differing)} session(s): {names}")
    if summary.not_found:
        raise NotFoundError(f"not on the stream nor in the store: {', '.join(summary.not_found)}")


def _print(summary: VerifySummary, as_json: bool) -> None:
    if as_json:
        click.echo(msgspec.json.encode(summary.to_json()).decode())
        return
    for v in summary.verified:
        for difference in v.differences:
            click.echo(f"{v.session}: {difference}")
    for session in summary.not_found:
        click.echo(f"{session}: not found")
    totals = summary.to_json()
    differing = sum(1 for v in summary.verified if v.differences)
    click.echo(
        f"verified {totals['sessions']} sessions: {totals['steps']} steps, "
        f"{totals['chunks']} retained chunks, {differing} with differences, "
        f"{len(summary.not_found)} not found"
    )
