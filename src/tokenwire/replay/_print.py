"""EventPrinter: replay events written to a terminal the way the user saw them.

Text streams as it came; reasoning is dimmed; a tool call is one line once complete; a step
opens with a header (turn, step, provider/model, time to first chunk, the step it follows;
for a routed step the public name, the deployment and the attempts that failed before it)
and closes with its finish or its error, followed by the resume id (``--from-seq``) of the
next event. Steps read from the store (gone from the broker) are announced as such.
"""

from __future__ import annotations

from typing import IO, assert_never

from tokenwire.replay._events import (
    ReplayEvent,
    Shown,
    ShownError,
    ShownFinish,
    ShownReasoning,
    ShownStepStart,
    ShownText,
    ShownToolCall,
)
from tokenwire.schemas import ChunkEnvelope, FailedAttempt, Routed, StepLink, TokenUsage


class EventPrinter:
    """Write events to ``file`` (styled when it is a terminal, plain otherwise)."""

    def __init__(self, file: IO[str], *, color: bool | None = None) -> None:
        # rich is imported by the commands that print (replay, tail), not by every process
        # that imports the replay package (a gateway mounts its events router).
        from rich.console import Console

        self._console = Console(
            file=file,
            force_terminal=color,
            no_color=color is False,
            highlight=False,
            markup=False,
            emoji=False,
            soft_wrap=True,
        )
        self._current: tuple[int, int] | None = None
        self._at_line_start = True
        self._source = "broker"

    def print(self, event: ReplayEvent) -> None:
        """Write what the event showed (nothing for an event that showed nothing)."""
        if event.shown and event.source != self._source:
            self._source = event.source
            if event.source == "store":
                self.line("(from the store: the broker no longer retains these steps)", "yellow")
            else:
                self.line("(from the broker)", "yellow")
        for shown in event.shown:
            self._show(event, shown)

    def line(self, text: str, style: str = "") -> None:
        """A line of its own (a notice), starting on a fresh line."""
        self._newline()
        self._console.print(text, style=style or None)
        self._at_line_start = True

    def _show(self, event: ReplayEvent, shown: Shown) -> None:
        if event.step_key != self._current and not isinstance(shown, ShownStepStart):
            self._switch(event)
        match shown:
            case ShownStepStart():
                self._header(event, shown)
            case ShownText():
                self._write(shown.text, "")
            case ShownReasoning():
                self._write(shown.text, "dim italic")
            case ShownToolCall():
                call = shown.call
                self.line(f"⚙ tool call {call.name}({call.arguments})  id={call.id}", "cyan")
            case ShownFinish():
                self.line(
                    f"■ finish {shown.reason}{_usage(shown.usage)}"
                    f"{_dropped(shown.dropped_tool_calls)}",
                    "green",
                )
                self._resume(event)
            case ShownError():
                error = shown.error
                self.line(f"✖ {error.kind} error: {error.message}", "bold red")
                self._resume(event)
            case _:
                assert_never(shown)

    def _header(self, event: ReplayEvent, shown: ShownStepStart) -> None:
        env = event.envelope
        ttfc = shown.time_to_first_chunk_s
        after = f" · first chunk after {ttfc:.3f} s" if ttfc is not None else ""
        where = (
            f"store chunk {event.index}" if event.source == "store" else f"stream seq {event.seq}"
        )
        self.line(
            f"── turn {env.turn} · step {env.step} · {env.provider}/{env.model}{after} "
            f"· {where}{_parent(env)} ──",
            "bold",
        )
        if isinstance(env.routed, Routed):
            self.line(f"  ⇢ {env.routed.route} via {env.routed.deployment}", "blue")
            for attempt in env.routed.attempts:
                self.line(f"    ✗ {attempt_line(attempt)}", "yellow")
        self._current = event.step_key

    def _switch(self, event: ReplayEvent) -> None:
        """Steps of one session may interleave: say whose text follows."""
        self.line(f"[turn {event.envelope.turn} · step {event.envelope.step}]", "bold")
        self._current = event.step_key

    def _resume(self, event: ReplayEvent) -> None:
        if event.source == "store":
            return  # the store's part is read again from the start
        seq = event.seq + 1 if event.last else event.seq  # a step ends its frame
        self.line(f"  (resume: --from-seq {seq})", "dim")

    def _write(self, text: str, style: str) -> None:
        self._console.print(text, style=style or None, end="")
        self._at_line_start = text.endswith("\n")

    def _newline(self) -> None:
        if not self._at_line_start:
            self._console.print()
            self._at_line_start = True

    def close(self) -> None:
        """End the last partial line."""
        self._newline()


def _usage(usage: TokenUsage | None) -> str:
    if usage is None:
        return ""
    parts = [f"{usage.input_tokens} in" if usage.input_tokens is not None else ""]
    parts.append(f"{usage.output_tokens} out" if usage.output_tokens is not None else "")
    text = " / ".join(p for p in parts if p)
    return f" · {text}" if text else ""


def _dropped(count: int) -> str:
    return f" · {count} truncated tool call(s) dropped" if count else ""


def _parent(env: ChunkEnvelope) -> str:
    """The step this one follows: within its session, or the step that spawned it."""
    parent = env.parent
    if not isinstance(parent, StepLink):
        return ""
    if parent.session == env.session:
        return f" · after turn {parent.turn} step {parent.step}"
    return f" · spawned by {parent}"


def attempt_line(attempt: FailedAttempt) -> str:
    """One attempt that failed before a routed step's first byte, in a line: the deployment,
    why, the provider's status and ``retry-after``, its message."""
    status = f" HTTP {attempt.status}" if attempt.status is not None else ""
    wait = "" if attempt.retry_after_s is None else f", retry-after {attempt.retry_after_s:g} s"
    message = f": {attempt.message}" if attempt.message else ""
    where = f"{attempt.deployment} ({attempt.provider}/{attempt.model})"
    return f"{where} {attempt.failure}{status}{wait}{message}"
