"""``tokenwire demo`` and ``tokenwire up``: the embedded stack, and a fleet driven through it."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import statistics
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from shlex import quote

import click
import msgspec
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from tokenwire import variables as v
from tokenwire.broker import Connection, RequestFailed, Topology, connect, read_range
from tokenwire.cli._common import (
    invocation,
    port_or_free,
    settings,
    topology,
)
from tokenwire.cli._errors import CheckFailedError, UsageError
from tokenwire.cli._flags import variable_flags
from tokenwire.cli._fleet import ExpectedTotals, FleetPlan, FleetResult, expected_totals, run_fleet
from tokenwire.cli._running import run_until_signal
from tokenwire.cli._stack import STACK_MARGIN_S, Stack, StackPorts, port_flags
from tokenwire.config import stop_timeout
from tokenwire.schemas import ErrorEvent, MessageEvent, StreamStarted
from tokenwire.store import Store, open_store

PERSIST_TIMEOUT_S = 60.0
SHOWN_FAILURES = 5
"""Unexpected request failures printed one per line (the summary JSON keeps more)."""
console = Console(highlight=False)


@dataclass
class Observed:
    """What the store and the telemetry path hold for the fleet's sessions."""

    steps: int = 0
    messages: int = 0
    max_tokens_messages: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    chunks: int = 0
    ttfc_s: list[float] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)


@click.command()
@click.option("--sessions", default=20, show_default=True, type=click.IntRange(1, 1000))
@click.option("--turns", default=2, show_default=True, type=click.IntRange(1, 100))
@click.option(
    "--steps",
    default=2,
    show_default=True,
    type=click.IntRange(2, 100),
    help="Steps per turn: a tool step, reasoning steps, an answer.",
)
@click.option(
    "--keep", is_flag=True, help="Keep the stack running after the summary (Ctrl-C stops)."
)
@click.option(
    "--provider",
    default="scripted",
    show_default=True,
    help="Run the fleet against this provider (e.g. openai, with its key set).",
)
@click.option("--model", help="The model for --provider (e.g. gpt-4o-mini).")
@click.option(
    "--summary-json",
    type=click.Path(dir_okay=False, writable=True),
    help="Also write the summary as JSON to this file.",
)
@port_flags
@variable_flags("demo")
@click.pass_context
def demo(
    ctx: click.Context,
    *,
    sessions: int,
    turns: int,
    steps: int,
    keep: bool,
    provider: str,
    model: str | None,
    summary_json: str | None,
    ports: StackPorts,
) -> None:
    """Start the embedded stack, drive a fleet of agent sessions through it, summarise."""
    s = settings(ctx)
    if provider != "scripted" and not model:
        raise UsageError("--provider needs --model (e.g. --provider openai --model gpt-4o-mini)")
    plan = FleetPlan(
        sessions=sessions,
        turns=turns,
        steps=steps,
        run_id=uuid.uuid4().hex[:6],
        provider=provider,
        model=model,
    )
    gateway_port = port_or_free(s.gateway_host, s.gateway_port)
    stack = Stack(s, topology(s), gateway_port=gateway_port, ports=ports)
    ok = True

    async def main(stop: asyncio.Event) -> None:
        nonlocal ok
        try:
            with console.status(
                "starting nats-server, scripted provider, gateway, assembler, telemetry"
            ):
                await stack.start()
            ok = await _demo(stack, plan, summary_json, keep=keep)
            if keep:
                _print_addresses(stack)
                console.print("stack running; Ctrl-C stops it")
                await stop.wait()
        finally:
            stack.stop()

    run_until_signal(
        main, log_level=logging.WARNING, stop_timeout_s=stop_timeout() + STACK_MARGIN_S
    )
    if not ok:
        raise CheckFailedError("the demo's checks failed (see the summary above)")


@click.command()
@port_flags
@variable_flags("up")
@click.pass_context
def up(ctx: click.Context, ports: StackPorts) -> None:
    """Run the embedded stack in the foreground until Ctrl-C, printing the addresses.

    On the data directory a `demo` used, it serves that demo's sessions again (replay, tail,
    messages, the viewer). Every port is a flag (0: a free one); a port that is taken fails
    at once, naming it.
    """
    s = settings(ctx)

    async def main(stop: asyncio.Event) -> None:
        stack = Stack(s, topology(s), ports=ports)
        try:
            await stack.start()
            _print_addresses(stack)
            await stop.wait()
        finally:
            stack.stop()

    run_until_signal(main, stop_timeout_s=stop_timeout() + STACK_MARGIN_S)


def _print_addresses(stack: Stack) -> None:
    for part, address in stack.addresses.items():
        click.echo(f"{part}: {address}", nl=True)


async def _demo(stack: Stack, plan: FleetPlan, summary_json: str | None, *, keep: bool) -> bool:
    expected = expected_totals(plan)
    result = await _drive(stack, plan, expected.steps)
    _announce_failures(result)
    store = open_store(stack.settings.store_url)
    nc = await connect(stack.nats_url)
    try:
        observed = await _observe(nc, stack.topology, store, result.sessions, expected)
    finally:
        await nc.close()
        await store.close()
    _summary(stack, plan, expected, result, observed, running=keep)
    if summary_json:
        document = msgspec.json.encode(_summary_doc(expected, result, observed))
        await asyncio.to_thread(Path(summary_json).write_bytes, document)
    return _checks_pass(expected, result, observed)


def _announce_failures(result: FleetResult) -> None:
    """Say at once, before the store is read (and waited for), that requests failed and why:
    a step refused before anything was published never reaches the broker, and the checks
    that follow can only say what is missing."""
    if result.failures:
        console.print(
            f"[red]{result.unexpected_failures} requests failed unexpectedly[/red]; "
            f"the first: {escape(result.failures[0].line())}"
        )


def _summary_doc(
    expected: ExpectedTotals, result: FleetResult, observed: Observed
) -> dict[str, object]:
    return {
        "expected": dataclasses.asdict(expected),
        "observed": {
            "steps": observed.steps,
            "messages": observed.messages,
            "max_tokens_messages": observed.max_tokens_messages,
            "errors": dict(observed.errors),
            "chunks": observed.chunks,
            "ttfc_signals": len(observed.ttfc_s),
            "differences": observed.differences,
        },
        "fleet": {
            "sessions": result.sessions,
            "completed_steps": result.completed_steps,
            "provider_errors": result.provider_errors,
            "unexpected_failures": result.unexpected_failures,
            "failures": [dataclasses.asdict(f) for f in result.failures],
            "retried_requests": result.retried_requests,
            "tool_calls": result.tool_calls,
            "wall_s": result.wall_s,
        },
        "passed": _checks_pass(expected, result, observed),
    }


async def _drive(stack: Stack, plan: FleetPlan, total: int) -> FleetResult:
    columns = (TextColumn("fleet"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("steps", total=total)
        return await run_fleet(plan, stack.addresses["gateway"], lambda: progress.advance(task))


async def _observe(
    nc: Connection, t: Topology, store: Store, sessions: list[str], expected: ExpectedTotals
) -> Observed:
    observed = Observed()
    with console.status("waiting for the assembler to persist every step"):
        outcomes = await _wait_persisted(store, sessions, expected.steps)
    for event in outcomes:
        observed.steps += 1
        observed.chunks += event.seq_end - event.seq_start + 1
        if isinstance(event, MessageEvent):
            observed.messages += 1
            observed.max_tokens_messages += event.message.finish_reason == "max-tokens"
        else:
            observed.errors[event.error.kind] += 1
    with console.status("reading stream-started signals from the telemetry path"):
        observed.ttfc_s = await _ttfc(nc, t, set(sessions), expected.steps)
    with console.status("replaying every session from the broker and verifying the store"):
        observed.differences = await _verify(nc, t, store, sessions)
    return observed


async def _wait_persisted(
    store: Store, sessions: list[str], steps: int
) -> list[MessageEvent | ErrorEvent]:
    deadline = time.monotonic() + PERSIST_TIMEOUT_S
    while True:
        outcomes = [e for s in sessions for e in await store.messages(s)]
        if len(outcomes) >= steps or time.monotonic() > deadline:
            return outcomes
        await asyncio.sleep(0.2)


async def _ttfc(nc: Connection, t: Topology, sessions: set[str], steps: int) -> list[float]:
    """Time to first chunk of each of the fleet's steps, as the telemetry consumer signalled."""
    found: dict[tuple[str, int, int], float] = {}
    next_seq = dict.fromkeys(t.events_streams, 1)
    deadline = time.monotonic() + PERSIST_TIMEOUT_S
    while len(found) < steps and time.monotonic() < deadline:
        for stream in t.events_streams:
            next_seq[stream] = await _read_started(nc, t, stream, next_seq[stream], sessions, found)
    return list(found.values())


async def _read_started(
    nc: Connection,
    t: Topology,
    stream: str,
    from_seq: int,
    sessions: set[str],
    found: dict[tuple[str, int, int], float],
) -> int:
    """The started signals of ``sessions`` in one events stream, from ``from_seq``, into
    ``found``; the next sequence to read. Returns when nothing new comes within a second."""
    try:
        async for seq, data in read_range(
            nc, stream, t.events_filter("started"), from_seq, last=None, idle_s=1.0
        ):
            from_seq = seq + 1
            signal = msgspec.json.decode(data, type=StreamStarted)
            if signal.session in sessions and signal.time_to_first_chunk_s is not None:
                found[(signal.session, signal.turn, signal.step)] = signal.time_to_first_chunk_s
    except RequestFailed:
        pass  # nothing new within a second; the caller's deadline bounds the wait
    return from_seq


async def _verify(nc: Connection, t: Topology, store: Store, sessions: list[str]) -> list[str]:
    from tokenwire.replay import SessionNotFound, verify

    differences: list[str] = []
    for session in sessions:
        try:
            differences += [f"{session}: {d}" for d in await verify(nc, t, store, session)]
        except SessionNotFound as exc:  # every step of it refused: a difference, not a crash
            differences.append(f"{session}: {exc}")
    return differences


def _checks_pass(expected: ExpectedTotals, result: FleetResult, observed: Observed) -> bool:
    if result.unexpected_failures:
        return False
    if expected.messages < 0:  # a real provider: only the step count is known in advance
        return observed.steps == expected.steps and not observed.differences
    return (
        observed.steps == expected.steps
        and observed.messages == expected.messages
        and sum(observed.errors.values()) == expected.errors
        and observed.max_tokens_messages == expected.max_tokens_messages
        and not observed.differences
    )


def _known(count: int) -> str:
    return str(count) if count >= 0 else ""


def _percentile(values: list[float], q: int) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0] * 1000:.1f} ms"
    return f"{statistics.quantiles(values, n=100, method='inclusive')[q - 1] * 1000:.1f} ms"


def _summary(
    stack: Stack,
    plan: FleetPlan,
    expected: ExpectedTotals,
    result: FleetResult,
    observed: Observed,
    *,
    running: bool,
) -> None:
    against = "" if plan.scripted else f" against {plan.provider}/{plan.model}"
    shape = f"{plan.sessions} sessions x {plan.turns} turns x {plan.steps} steps"
    table = Table(title=f"tokenwire demo: {shape}{against}")
    table.add_column("")
    table.add_column("observed", justify="right")
    table.add_column("expected", justify="right")
    for row in _summary_rows(plan, expected, result, observed):
        table.add_row(*row)
    console.print(table)
    for line in _failure_lines(result):
        console.print(f"[red]failed[/red] {escape(line)}")
    for difference in observed.differences[:20]:
        console.print(f"[red]difference[/red] {escape(difference)}")
    _print_pointers(stack, result, running=running)


def _summary_rows(
    plan: FleetPlan, expected: ExpectedTotals, result: FleetResult, observed: Observed
) -> list[tuple[str, str, str]]:
    """The summary table's rows: what, observed, expected."""
    errors = ", ".join(f"{k} {v}" for k, v in sorted(observed.errors.items())) or "none"
    return [
        ("sessions", str(len(result.sessions)), str(plan.sessions)),
        ("steps persisted", str(observed.steps), str(expected.steps)),
        ("chunks persisted", str(observed.chunks), ""),
        ("messages", str(observed.messages), _known(expected.messages)),
        (
            "  of which cut by max-tokens",
            str(observed.max_tokens_messages),
            _known(expected.max_tokens_messages),
        ),
        ("recorded errors", f"{sum(observed.errors.values())} ({errors})", _known(expected.errors)),
        ("requests failed unexpectedly", str(result.unexpected_failures), "0"),
        ("requests retried (gateway busy)", str(result.retried_requests), ""),
        ("tool calls dispatched by agents", str(result.tool_calls), ""),
        ("time to first chunk p50 (telemetry)", _percentile(observed.ttfc_s, 50), ""),
        ("time to first chunk p99 (telemetry)", _percentile(observed.ttfc_s, 99), ""),
        ("fleet wall time", f"{result.wall_s:.1f} s", ""),
        (
            "replay --verify",
            "passed" if not observed.differences else f"{len(observed.differences)} differences",
            "passed",
        ),
    ]


def _failure_lines(result: FleetResult, shown: int = SHOWN_FAILURES) -> list[str]:
    """The first ``shown`` unexpected failures, one line each, and how many more there were."""
    lines = [failure.line() for failure in result.failures[:shown]]
    more = result.unexpected_failures - len(lines)
    if more > 0:
        lines.append(f"... and {more} more (the first {len(result.failures)} in --summary-json)")
    return lines


def _print_pointers(stack: Stack, result: FleetResult, *, running: bool) -> None:
    """Where the data is, and the commands that look at a session, as they run from here:
    first ``up`` on the same data (unless the stack still runs), then the read commands."""
    session = result.sessions[min(1, len(result.sessions) - 1)]
    s = stack.settings
    console.print(
        f"data: {s.data_dir} (broker under {s.data_dir / 'jetstream'}, store {s.store_url})",
        soft_wrap=True,
    )
    program = invocation()
    same_data = (
        "" if s.data_dir == Path(v.DATA_DIR.default) else f" --data-dir {quote(str(s.data_dir))}"
    )
    if running:
        console.print("the stack runs until Ctrl-C; from another terminal, look at a session:")
    else:
        console.print(
            "the demo stopped its stack; the data stays. To look at a session, start "
            "the stack again on it (in another terminal; Ctrl-C stops it):",
            soft_wrap=True,
        )
        console.print(f"  {program} up{same_data}{_gateway_flag(stack)}", soft_wrap=True)
        console.print("then, once it printed its addresses:")
    for command, note in (
        (f"replay {session}", "as the user saw it, with the original timing"),
        (f"replay {session} --verify", "the broker's chunks against the store"),
        (f"tail {session}", "follows the session live until Ctrl-C"),
        (f"messages {session}", "the assembled messages and recorded errors"),
        (f"usage --session {session}", "tokens and cost per step"),
        ("usage --by model", "tokens and cost per model"),
    ):
        console.print(f"  {program} {command}{same_data}  # {note}", soft_wrap=True)
    console.print(
        f"  viewer: {stack.addresses['gateway']}/viewer?session={session}", soft_wrap=True
    )


def _gateway_flag(stack: Stack) -> str:
    """``--gateway-addr`` when the demo's gateway did not use the configured port (it was
    taken), so that ``up`` serves the viewer link printed below."""
    s = stack.settings
    if stack.gateway_port in (None, s.gateway_port):
        return ""
    host = f"[{s.gateway_host}]" if ":" in s.gateway_host else s.gateway_host
    return f" --gateway-addr {host}:{stack.gateway_port}"
