"""The README's first command, end to end: the demo on a real embedded stack.

These run real processes (nats-server, scripted provider, gateway, assembler, telemetry) and
check the summary against the fleet plan's ground truth, then that nothing is left running.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.cli import newcomer
from tests.replay.test_viewer import chromium as find_chromium
from tokenwire.cli._fleet import FleetPlan, expected_totals

REPO = Path(__file__).resolve().parents[2]
DEMO_STEPS_PER_SESSION = 4
"""The README's demo: 2 turns of 2 steps per session."""


def _leftovers(marker: str, cwd: Path | None = None) -> list[str]:
    """Processes whose command line mentions ``marker`` (our data directory), or that run in
    ``cwd`` (the default data directory is relative to it)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "environ", "cwd"]):
        try:
            cmdline = " ".join(proc.info["cmdline"] or [])
            env = proc.info["environ"] or {}
            here = proc.info["cwd"]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if proc.pid != os.getpid() and (
            marker in cmdline
            or env.get("TOKENWIRE_DATA_DIR") == marker
            or (cwd is not None and here == str(cwd))
        ):
            found.append(f"{proc.pid} {cmdline}")
    return found


def _run_demo(
    cwd: Path, argv: list[str], data_dir: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TOKENWIRE_DATA_DIR": str(data_dir)}
    env.pop("TOKENWIRE_NATS_URL", None)
    env.pop("TOKENWIRE_STORE", None)
    try:
        return subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:  # what it printed says how far it got, and why
        out, err = (_text(part) for part in (exc.stdout, exc.stderr))
        pytest.fail(f"{argv} ran past {timeout} s:\n{out[-3000:]}{err[-3000:]}")


def _text(part: str | bytes | None) -> str:
    return part.decode(errors="replace") if isinstance(part, bytes) else part or ""


def _why(done: subprocess.CompletedProcess[str], summary: Path) -> str:
    """The fleet's unexpected request failures (from the summary JSON, when written) and the
    tail of the demo's output: a failed run explains itself."""
    failures = (
        json.loads(summary.read_text())["fleet"]["failures"]
        if summary.is_file()
        else "(no summary JSON written)"
    )
    return f"failures: {failures}\n{done.stdout[-3000:]}{done.stderr[-3000:]}"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_demo_summary_matches_the_plan_and_leaves_nothing_running(tmp_path: Path) -> None:
    data = tmp_path / "data"
    summary = tmp_path / "summary.json"
    argv = [
        sys.executable,
        "-m",
        "tokenwire",
        "demo",
        "--sessions",
        "4",
        "--turns",
        "2",
        "--steps",
        "3",
        "--summary-json",
        str(summary),
    ]
    done = _run_demo(tmp_path, argv, data, timeout=240)
    why = _why(done, summary)
    assert done.returncode == 0, why

    expected = expected_totals(FleetPlan(sessions=4, turns=2, steps=3, run_id="x"))
    doc = json.loads(summary.read_text())
    observed = doc["observed"]
    assert doc["fleet"]["unexpected_failures"] == 0, why
    assert doc["fleet"]["provider_errors"] == expected.errors == 1, why
    assert observed["steps"] == expected.steps == 24, why
    assert observed["messages"] == expected.messages == 23, why
    assert observed["errors"] == {"provider": 1}, why
    assert observed["max_tokens_messages"] == 1, why
    assert observed["ttfc_signals"] == expected.steps, why
    assert observed["differences"] == [], why
    assert doc["passed"] is True, why
    assert "replay --verify" in done.stdout
    assert (data / "store.db").is_file()
    assert (data / "nats.url").is_file()
    assert _leftovers(str(data)) == []


@pytest.fixture
def browser() -> str:
    """Chromium, as the viewer's own tests find it (skipped, or failed on CI, without it)."""
    return str(find_chromium.__wrapped__())  # type: ignore[attr-defined]  # functools.cache's wrapper: a fresh search


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_newcomer_path_from_a_fresh_clone_works_as_printed(tmp_path: Path, browser: str) -> None:
    """The README's first command in a fresh clone, then every command the demo prints, run as
    printed from the clone (``up`` first, in the background), then the printed viewer link,
    also on a gateway with a key (``TOKENWIRE_GATEWAY_KEYS``): it asks for the key, then
    shows the session."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("## Quick start", 1)[1].split("```sh", 1)[1].split("```", 1)[0]
    first = block.strip().splitlines()[0].strip()
    assert first == "make demo"
    if shutil.which("git") is None or shutil.which("make") is None:
        pytest.fail("git and make are needed to run the README's command from a fresh clone")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True, timeout=120)
    env = newcomer.environment()
    done = subprocess.run(
        ["bash", "-c", first],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "replay --verify" in done.stdout
    assert "passed" in done.stdout
    assert _leftovers(str(clone / ".tokenwire"), cwd=clone) == []

    steps = newcomer.next_steps(done.stdout)
    assert steps.up[0] == ".venv/bin/tokenwire", steps.up  # runs from the clone, as printed
    stack = newcomer.up(steps, clone, env, tmp_path / "up.log")
    try:
        newcomer.check_commands(steps, clone, env, DEMO_STEPS_PER_SESSION, tmp_path)
        dom = newcomer.viewer_dom(browser, steps.viewer, tmp_path)
        assert f"({DEMO_STEPS_PER_SESSION} steps, " in dom, dom[-3000:]
        assert " events loaded" in dom, dom[-3000:]
        assert ">chunks 1-" in dom
    finally:
        assert newcomer.interrupt(stack) == 130

    key = "tw-newcomer-SENTINEL-5e6f7a8b9c0d"
    keyed = newcomer.environment(TOKENWIRE_GATEWAY_KEYS=key)
    stack = newcomer.up(steps, clone, keyed, tmp_path / "up-keyed.log")
    try:
        dom = newcomer.viewer_dom(browser, steps.viewer, tmp_path)
        assert "This gateway wants a key: enter it." in dom, dom[-3000:]
        assert "events loaded" not in dom
        dom = newcomer.viewer_dom(browser, f"{steps.viewer}#key={key}", tmp_path)
        assert " events loaded" in dom, dom[-3000:]
        assert ">chunks 1-" in dom
    finally:
        assert newcomer.interrupt(stack) == 130
    assert _leftovers(str(clone / ".tokenwire"), cwd=clone) == []


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_the_demo_fleet_runs_against_a_named_provider(tmp_path: Path) -> None:
    """``--provider openai --model M``: the same fleet through the gateway's openai route.

    There is no network here, so "openai" is the scripted provider standing in at
    TOKENWIRE_OPENAI_BASE_URL, as any compatible server can; only the step count is known in
    advance, and every step must be persisted and verified.
    """
    from tokenwire.services.scripted_provider import ScriptedServer

    async with ScriptedServer() as upstream:
        env = {
            **os.environ,
            "TOKENWIRE_DATA_DIR": str(tmp_path / "data"),
            "TOKENWIRE_OPENAI_BASE_URL": f"{upstream.url}/v1",
            "OPENAI_API_KEY": "sk-test-x",
        }
        for name in ("TOKENWIRE_NATS_URL", "TOKENWIRE_STORE"):
            env.pop(name, None)
        summary = tmp_path / "summary.json"
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tokenwire",
            "demo",
            "--provider",
            "openai",
            "--model",
            "tools",
            "--sessions",
            "3",
            "--turns",
            "1",
            "--steps",
            "2",
            "--summary-json",
            str(summary),
            cwd=tmp_path,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 240)
    doc = json.loads(summary.read_text()) if summary.is_file() else {"fleet": {"failures": None}}
    why = f"failures: {doc['fleet']['failures']}\n{out.decode()[-3000:]}{err.decode()[-3000:]}"
    assert proc.returncode == 0, why
    assert doc["fleet"]["unexpected_failures"] == 0, why
    assert doc["observed"]["steps"] == 6
    assert doc["observed"]["messages"] == 6
    assert doc["observed"]["differences"] == []
    assert doc["fleet"]["tool_calls"] == 6  # step 0 of each session asks for two tools
    assert "openai/tools" in out.decode()
