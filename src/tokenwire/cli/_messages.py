"""``tokenwire messages``: a session's persisted, assembled messages and recorded errors."""

from __future__ import annotations

from typing import assert_never

import click
import msgspec

from tokenwire.cli._common import (
    checked_session,
    opened_store,
    resolve_store_url,
    run_command,
    write_json,
)
from tokenwire.cli._errors import NotFoundError
from tokenwire.cli._flags import variable_flags
from tokenwire.replay import attempt_line, stored_parents, with_parent
from tokenwire.schemas import (
    ErrorEvent,
    ImageBlock,
    Message,
    MessageEvent,
    ReasoningBlock,
    RecordedError,
    Routed,
    StepLink,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
)


@click.command()
@click.argument("session")
@click.option("--json", "as_json", is_flag=True, help="Print the stored events as JSONL.")
@variable_flags("messages")
def messages(session: str, as_json: bool) -> None:
    """Show SESSION's stored messages and recorded errors, each with the session's chunk
    numbers it was folded from (``chunks 1-24``; not the broker's stream seq)."""
    checked_session(session)
    url = resolve_store_url()
    run_command(lambda: _messages(url, session, as_json))


async def _messages(url: str, session: str, as_json: bool) -> None:
    async with opened_store(url) as store:
        outcomes = await store.messages(session)
        parents = await stored_parents(store, session, outcomes)
        where = store.url
    if not outcomes:
        raise NotFoundError(f"session {session!r} has no stored messages in {where}")
    for outcome in outcomes:
        if as_json:
            write_json(with_parent(outcome, parents))
        else:
            _print(outcome, parents.get((outcome.turn, outcome.step)))


def _print(outcome: MessageEvent | ErrorEvent, parent: StepLink | None) -> None:
    head = (
        f"turn {outcome.turn} · step {outcome.step} · chunks {outcome.seq_start}-"
        f"{outcome.seq_end} · {outcome.provider}/{outcome.model}{_after(outcome, parent)}"
    )
    if isinstance(outcome, MessageEvent):
        click.secho(
            f"{head} · message ({outcome.message.finish_reason}){_usage(outcome.message)}",
            bold=True,
        )
        _print_route(outcome.routed)
        _print_message(outcome.message)
    else:
        click.secho(f"{head} · {_error(outcome.error)}", bold=True, fg="red")
        _print_route(outcome.routed)


def _print_route(routed: Routed | msgspec.UnsetType) -> None:
    """A routed step's public name and deployment, and each attempt that failed before it."""
    if not isinstance(routed, Routed):
        return
    click.secho(f"  ⇢ {routed.route} via {routed.deployment}", fg="blue")
    for attempt in routed.attempts:
        click.secho(f"    ✗ {attempt_line(attempt)}", fg="yellow")


def _print_message(message: Message) -> None:
    for block in message.content:
        match block:
            case TextBlock():
                click.echo(f"  {block.text}")
            case ReasoningBlock():
                click.secho(f"  (reasoning) {block.text or '[redacted]'}", dim=True)
            case ToolCallBlock():
                click.secho(f"  ⚙ {block.name}({block.arguments})  id={block.id}", fg="cyan")
            case ToolResultBlock():
                click.echo(f"  ↳ result for {block.tool_call_id}: {block.content}")
            case ImageBlock():
                click.echo(f"  [image {block.media_type}]")
            case _:
                assert_never(block)
    for call in message.dropped_tool_calls:
        click.secho(f"  ✂ dropped truncated call {call.name}({call.arguments})", fg="yellow")


def _after(outcome: MessageEvent | ErrorEvent, parent: StepLink | None) -> str:
    """The step this one follows: in its session, or the step that spawned it."""
    if parent is None:
        return ""
    if parent.session == outcome.session:
        return f" · after turn {parent.turn} step {parent.step}"
    return f" · spawned by {parent}"


def _usage(message: Message) -> str:
    usage = message.usage
    if usage is None:
        return ""
    counts = [
        f"{v} {k.removesuffix('_tokens').replace('_', ' ')}"
        for k, v in ((f, getattr(usage, f)) for f in usage.__struct_fields__)
        if v is not None
    ]
    return f" · {', '.join(counts)} tokens" if counts else ""


def _error(error: RecordedError) -> str:
    tags = ", ".join(t for t in ("retryable" if error.retryable else "", error.code or "") if t)
    return f"error {error.kind}{f' ({tags})' if tags else ''}: {error.message}"
