"""``tokenwire fold`` as a script sees it: a subprocess, its stdout JSON and its exit code."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.fixtures.recordings import recordings_dir


def _fold(provider: str, path: str) -> subprocess.CompletedProcess[bytes]:
    body = (recordings_dir() / path).read_bytes()
    command = [sys.executable, "-m", "tokenwire", "fold", "--provider", provider, "-"]
    return subprocess.run(command, input=body, capture_output=True, timeout=60, check=False)


def test_a_recorded_error_is_marked_and_exits_1() -> None:
    done = _fold("groq", "groq/chat-midstream-error-tool-use-failed.sse")
    assert done.returncode == 1, done.stderr
    printed = json.loads(done.stdout)
    assert (printed["type"], printed["kind"], printed["code"]) == (
        "error",
        "provider",
        "tool_use_failed",
    )
    assert printed["message"].startswith("Tool call validation failed")
    assert b"recorded error (provider)" in done.stderr


def test_a_message_exits_0_and_has_no_error_marker() -> None:
    done = _fold("anthropic", "anthropic/messages-stop-max-tokens.sse")
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert "type" not in printed
    assert printed["finish_reason"] == "max-tokens"
    assert printed["content"][0]["type"] == "text"
