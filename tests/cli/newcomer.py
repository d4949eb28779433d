"""A newcomer's first hour, as the demo prints it: the commands of its closing lines, run as
printed from where the demo ran (``up`` in the background, then each one), and the viewer
link in headless Chromium, also on a gateway that wants a key.
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.replay.test_viewer import run_chromium

READY_S = 120.0
COMMAND_S = 120.0


@dataclass
class NextSteps:
    """The demo's closing lines: ``up`` (argv), the commands after it (one argv each, the
    ``# note`` dropped as a shell would), the viewer URL and the session they look at."""

    up: list[str]
    commands: list[list[str]]
    viewer: str
    session: str


def next_steps(printed: str) -> NextSteps:
    """Parse the demo's closing lines (after the summary table)."""
    tail = printed.split("To look at a session", 1)[1]
    lines = [line.strip() for line in tail.splitlines() if line.startswith("  ")]
    up = shlex.split(lines[0], comments=True)
    assert "up" in up, lines[0]
    commands = [
        shlex.split(line, comments=True) for line in lines[1:] if not line.startswith("viewer:")
    ]
    viewer = next(line.removeprefix("viewer: ") for line in lines if line.startswith("viewer:"))
    session = re.search(r"session=([\w-]+)", viewer)
    assert session is not None, viewer
    return NextSteps(up, commands, viewer, session.group(1))


@dataclass
class Lines:
    """A child process's stdout lines as they come, read by a thread (bounded waits)."""

    proc: subprocess.Popen[str]
    seen: list[str] = field(default_factory=list)
    _queue: queue.Queue[str | None] = field(default_factory=queue.Queue)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def until(self, done: re.Pattern[str], count: int, bound_s: float) -> list[str]:
        """Read until ``count`` lines matched ``done`` (or the output ended, or the bound)."""
        deadline = time.monotonic() + bound_s
        while sum(bool(done.search(line)) for line in self.seen) < count:
            try:
                line = self._queue.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
        return self.seen


def start(argv: list[str], cwd: Path, env: dict[str, str], log: Path) -> Lines:
    with log.open("ab") as err:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,
        )
    return Lines(proc)


def interrupt(lines: Lines) -> int:
    """SIGINT, as Ctrl-C would; the exit code (bounded)."""
    lines.proc.send_signal(signal.SIGINT)
    try:
        return lines.proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        lines.proc.kill()
        return lines.proc.wait()
    finally:
        if lines.proc.stdout is not None:
            lines.proc.stdout.close()


def run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=COMMAND_S, check=False
    )


def up(steps: NextSteps, cwd: Path, env: dict[str, str], log: Path) -> Lines:
    """``up`` as printed, in the background; returns once it printed its gateway's address."""
    stack = start(steps.up, cwd, env, log)
    seen = stack.until(re.compile(r"^gateway: http"), 1, READY_S)
    if not any(line.startswith("gateway: ") for line in seen):
        interrupt(stack)
        raise AssertionError(f"`up` printed no gateway address: {seen}\n{log.read_text()[-3000:]}")
    return stack


def check_commands(
    steps: NextSteps, cwd: Path, env: dict[str, str], steps_per_session: int, logs: Path
) -> None:
    """Each printed command, run as printed against the running ``up``, does what its note
    says (``tail`` until it showed every step, then Ctrl-C)."""
    session = steps.session
    for argv in steps.commands:
        if "tail" in argv:
            follower = start(argv, cwd, env, logs / "tail.err")
            shown = follower.until(
                re.compile(r"\(resume: --from-seq \d+\)"), steps_per_session, COMMAND_S
            )
            assert interrupt(follower) == 130, shown
            assert "".join(shown).count("(resume: --from-seq") == steps_per_session, shown
            assert "tail stopped; resume with:" in (logs / "tail.err").read_text()
            continue
        done = run(argv, cwd, env)
        assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}{done.stderr[-2000:]}"
        if "--verify" in argv:
            assert f"verified {session}: {steps_per_session} steps" in done.stdout, done.stdout
            assert "no differences" in done.stdout
        elif "replay" in argv:
            assert done.stdout.count("── turn ") == steps_per_session, done.stdout
            assert "· stream seq " in done.stdout
        elif "messages" in argv:
            assert done.stdout.count("· chunks ") == steps_per_session, done.stdout
        elif "usage" in argv:
            assert "total" in done.stdout, done.stdout


def viewer_dom(chromium: str, page: str, profile: Path) -> str:
    """The viewer page as Chromium rendered it, without its script's text."""
    dom = asyncio.run(run_chromium(chromium, profile, "--dump-dom", page)).decode()
    return dom.partition("<script>")[0]


def environment(**extra: str) -> dict[str, str]:
    """A newcomer's environment: none of tokenwire's variables but ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOKENWIRE_")}
    return {**env, **extra}
