"""The read-side commands in process (``tokenwire.cli.main``) against a real nats-server and store.

The CLI reads the default topology (prefix ``tw``, stream ``TOKENWIRE``), so this module runs
its own nats-server with that topology; tests isolate themselves by session id.
"""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.broker import close_client
from tests.fixtures.stores import run_sql
from tests.replay.sessions import (
    CALLS_0,
    EXPECTED_REASONING,
    EXPECTED_TEXT,
    commit_folded,
    envelopes,
    publish,
)
from tokenwire.broker import EmbeddedServer, Topology, connect, ensure_topology
from tokenwire.cli import main
from tokenwire.store import open_store

PARTITIONS = 4


@pytest.fixture(scope="module")
def cli_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = EmbeddedServer(tmp_path_factory.mktemp("cli-nats"))
    server.start()
    try:
        asyncio.run(_provision(server.url))
        yield server.url
    finally:
        server.stop()


async def _provision(url: str) -> None:
    nc = await connect(url)
    try:
        await ensure_topology(nc, Topology(partitions=PARTITIONS))
    finally:
        await close_client(nc)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cli_server: str) -> dict[str, str]:
    """A clean environment pointing at the module's server and a fresh SQLite store."""
    for name in ("TOKENWIRE_NATS_URL", "TOKENWIRE_STORE", "TOKENWIRE_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)
    values = {
        "TOKENWIRE_NATS_URL": cli_server,
        "TOKENWIRE_STORE": f"sqlite:///{tmp_path / 'store.db'}",
        "TOKENWIRE_DATA_DIR": str(tmp_path / "data"),
        "TOKENWIRE_PARTITIONS": str(PARTITIONS),
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def recorded_session(env: dict[str, str], *, store: bool = True) -> str:
    """Publish the scripted session (and commit its fold to the store); return its id."""
    session = f"c-{uuid.uuid4().hex[:10]}"
    sent = envelopes(session)

    async def go() -> None:
        nc = await connect(env["TOKENWIRE_NATS_URL"])
        try:
            await publish(nc, Topology(partitions=PARTITIONS), sent)
        finally:
            await close_client(nc)
        if store:
            opened = open_store(env["TOKENWIRE_STORE"])
            try:
                await commit_folded(opened, sent)
            finally:
                await opened.close()

    asyncio.run(go())
    return session


def jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_replay_json_is_the_scripted_session(env, capsys):
    session = recorded_session(env, store=False)
    assert main(["replay", session, "--max", "--json"]) == 0
    events = jsonl(capsys.readouterr().out)
    text: dict[tuple[int, int], str] = {}
    reasoning: dict[tuple[int, int], str] = {}
    for event in events:
        key = (event["envelope"]["turn"], event["envelope"]["step"])
        for shown in event["shown"]:
            if shown["type"] == "text":
                text[key] = text.get(key, "") + shown["text"]
            if shown["type"] == "reasoning":
                reasoning[key] = reasoning.get(key, "") + shown["text"]
    assert text == EXPECTED_TEXT
    assert reasoning == EXPECTED_REASONING
    assert len(events) == len(envelopes(session))


def test_replay_text_shows_what_the_user_saw(env, capsys):
    session = recorded_session(env, store=False)
    assert main(["replay", session, "--speed", "1000"]) == 0
    out = capsys.readouterr().out
    for text in EXPECTED_TEXT.values():
        assert text in out
    for call in CALLS_0:
        assert f"tool call {call.name}({call.arguments})" in out
    assert "search(" not in out  # the truncated call is never shown
    assert "first chunk after 0.250 s" in out
    assert "provider error: upstream overloaded" in out


def test_replay_from_seq_continues_after_a_resume_id(env, capsys):
    session = recorded_session(env, store=False)
    assert main(["replay", session, "--max", "--json"]) == 0
    everything = jsonl(capsys.readouterr().out)
    cut = everything[40]["seq"]
    assert main(["replay", session, "--max", "--json", "--from-seq", str(cut + 1)]) == 0
    assert jsonl(capsys.readouterr().out) == everything[41:]


def test_replay_of_an_unknown_session_exits_1(env, capsys):
    assert main(["replay", "no-such-session", "--max"]) == 1
    err = capsys.readouterr().err
    assert "not found" in err
    assert "no-such-session" in err
    assert len(err.strip().splitlines()) == 1


def test_missing_nats_url_exits_2(env, monkeypatch, capsys):
    monkeypatch.delenv("TOKENWIRE_NATS_URL")
    assert main(["replay", "s-1", "--max"]) == 2
    assert "no NATS server" in capsys.readouterr().err
    assert main(["tail", "s-1"]) == 2
    assert main(["status"]) == 2


def test_the_url_recorded_in_the_data_dir_is_used(env, monkeypatch, capsys):
    session = recorded_session(env, store=False)
    data = Path(env["TOKENWIRE_DATA_DIR"])
    data.mkdir(parents=True)
    (data / "nats.url").write_text(env["TOKENWIRE_NATS_URL"] + "\n")
    monkeypatch.delenv("TOKENWIRE_NATS_URL")
    assert main(["replay", session, "--max", "--json"]) == 0
    assert len(jsonl(capsys.readouterr().out)) == len(envelopes(session))


def test_a_stopped_stacks_recorded_url_says_to_start_up(env, monkeypatch, capsys):
    """The URL a stopped ``demo`` left in the data directory: each broker command says at once
    (not after the connect timeout) that the stack is stopped and to start ``tokenwire up``."""
    data = Path(env["TOKENWIRE_DATA_DIR"])
    data.mkdir(parents=True)
    with socket.socket() as closed:  # a loopback port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    (data / "nats.url").write_text(f"nats://127.0.0.1:{port}\n")
    monkeypatch.delenv("TOKENWIRE_NATS_URL")
    monkeypatch.setenv("TOKENWIRE_CONNECT_TIMEOUT_S", "600")  # the answer must not wait for it
    for argv in (
        ["replay", "s-1", "--max"],
        ["replay", "s-1", "--verify"],
        ["tail", "s-1"],
        ["status"],
        ["rebuild"],
    ):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert f"nats://127.0.0.1:{port}" in err, err
        assert "start it again with `tokenwire up` (same data directory)" in err, err


def test_usage_errors_exit_2(env, capsys):
    assert main(["replay", "s-1", "--max", "--speed", "2"]) == 2
    assert main(["replay", "bad session!", "--max"]) == 2
    assert main(["messages", "bad session!"]) == 2
    for flag in (["--from-seq", "5"], ["--speed", "2"], ["--max"]):  # verify would ignore it
        assert main(["replay", "s-1", "--verify", *flag]) == 2
        assert "--verify compares whole sessions" in capsys.readouterr().err


def test_verify_passes_on_a_clean_run(env, capsys):
    session = recorded_session(env)
    assert main(["replay", session, "--verify"]) == 0
    assert "no differences" in capsys.readouterr().out


def test_verify_fails_naming_the_altered_step(env, capsys):
    session = recorded_session(env)
    run_sql(
        env["TOKENWIRE_STORE"],
        "UPDATE steps SET outcome = replace(outcome, 'Enjoy', 'Avoid') "
        "WHERE session = %s AND turn = 1 AND step = 0",
        (session,),
    )
    assert main(["replay", session, "--verify"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].startswith("turn 1 step 0: message: text differs")
    assert "1 difference(s)" in captured.err
    assert main(["replay", session, "--verify", "--json"]) == 1
    [difference] = jsonl(capsys.readouterr().out)
    assert (difference["turn"], difference["step"], difference["kind"]) == (1, 0, "message")


def test_messages_lists_outcomes_with_seq_ranges(env, capsys):
    session = recorded_session(env)
    assert main(["messages", session, "--json"]) == 0
    outcomes = jsonl(capsys.readouterr().out)
    assert [(o["type"], o["turn"], o["step"]) for o in outcomes] == [
        ("message", 0, 0),
        ("message", 1, 0),
        ("message", 1, 1),
        ("error", 2, 0),
    ]
    sizes = {(t, s): len(c) for (t, s), c in _script_sizes().items()}
    assert [o["seq_end"] - o["seq_start"] + 1 for o in outcomes] == list(sizes.values())
    assert main(["messages", session]) == 0
    out = capsys.readouterr().out
    assert "turn 0 · step 0 · chunks 1-" in out
    assert EXPECTED_TEXT[1, 0] in out
    assert "error provider (retryable, overloaded_error): upstream overloaded" in out
    assert main(["messages", "no-such-session"]) == 1


def _script_sizes():
    from tests.replay.sessions import SCRIPT

    return SCRIPT


def test_status_reports_broker_stream_consumers_and_store(env, capsys):
    recorded_session(env)
    assert main(["status", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["broker"]["server_version"] == "2.15.1"
    (stream,) = report["streams"]  # one shard (TOKENWIRE_SHARDS' default)
    assert stream["name"] == "TOKENWIRE"
    assert stream["replicas"] == 1
    assert stream["messages"] == stream["last_seq"] > 0
    assert stream["lag"] == stream["messages"]  # no assembler runs
    assert stream["replay"]["budget_bytes"] == 4 * 1024**3
    assigned = [c for c in report["consumers"] if (c["durable"] or "").startswith("assembler-p")]
    assert len(assigned) == PARTITIONS
    # No assembler runs: every stored chunk is pending on exactly one partition's consumer.
    assert sum(c["num_pending"] for c in assigned) == stream["messages"]
    assert report["partitions"] == PARTITIONS
    assert [s["name"] for s in report["events"]] == ["TOKENWIRE_EVENTS"]
    assert report["store"]["stats"]["steps"] == 4
    assert main(["status"]) == 0
    assert "TOKENWIRE" in capsys.readouterr().out


@pytest.mark.postgres
def test_status_redacts_the_store_password(env, pg_url, capsys):
    with_password = pg_url.replace("postgresql://postgres@", "postgresql://postgres:s3cret@")
    assert main(["status", "--json", "--store", with_password]) == 0
    out = capsys.readouterr().out
    assert "s3cret" not in out
    url = json.loads(out)["store"]["url"]
    assert url.startswith("postgresql://")
    assert "@" not in url  # URLs lose their userinfo


async def _read_lines(proc, count: int) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    while len(lines) < count:
        raw = await asyncio.wait_for(proc.stdout.readline(), 20)
        assert raw, "tail ended early"
        lines.append(json.loads(raw))
    return lines


@pytest.mark.slow
async def test_a_killed_tail_resumes_from_its_last_id_missing_and_repeating_nothing(env):
    import os
    import signal
    import sys

    session = f"c-{uuid.uuid4().hex[:10]}"
    sent = envelopes(session)
    half = len(sent) // 2
    nc = await connect(env["TOKENWIRE_NATS_URL"])
    t = Topology(partitions=PARTITIONS)
    try:
        await publish(nc, t, sent[:half])
        argv = [sys.executable, "-m", "tokenwire", "tail", session, "--json"]
        spawn: dict[str, Any] = {
            "stdout": asyncio.subprocess.PIPE,
            "stderr": asyncio.subprocess.PIPE,
            "env": {**os.environ, **env},
        }
        first = await asyncio.create_subprocess_exec(*argv, **spawn)
        before = await _read_lines(first, 30)
        first.kill()  # SIGKILL: no chance to say anything
        await first.wait()

        resume_at = before[-1]["seq"] + 1
        second = await asyncio.create_subprocess_exec(*argv, "--from-seq", str(resume_at), **spawn)
        after = await _read_lines(second, half - 30)
        await publish(nc, t, sent[half:])  # live, while the tail follows
        after += await _read_lines(second, len(sent) - half)
        second.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(second.communicate(), 20)
    finally:
        await close_client(nc)

    events = before + after
    assert [e["envelope"]["ordinal"] for e in events] == [e.ordinal for e in sent]
    assert [(e["envelope"]["turn"], e["envelope"]["step"]) for e in events] == [
        (e.turn, e.step) for e in sent
    ]
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(set(seqs))  # nothing repeated
    assert f"--from-seq {seqs[-1] + 1}" in err.decode()


def test_verify_of_many_sessions_prints_one_summary(env, capsys):
    clean, altered = recorded_session(env), recorded_session(env)
    run_sql(
        env["TOKENWIRE_STORE"],
        "UPDATE steps SET outcome = replace(outcome, 'Enjoy', 'Avoid') "
        "WHERE session = %s AND turn = 1 AND step = 0",
        (altered,),
    )
    assert main(["replay", clean, recorded_session(env), "--verify"]) == 0
    captured = capsys.readouterr()
    assert "verified 2 sessions:" in captured.out
    assert "0 with differences, 0 not found" in captured.out
    assert "verify: 2/2 sessions" in captured.err  # progress, plain without a terminal
    assert main(["replay", clean, altered, "never-seen", "--verify", "--json"]) == 1
    [summary] = jsonl(capsys.readouterr().out)
    assert summary["sessions"] == 2
    assert summary["not_found"] == ["never-seen"]
    assert [(d["session"], d["turn"], d["step"]) for d in summary["differences"]] == [
        (altered, 1, 0)
    ]
    assert main(["replay", clean, altered, "--max"]) == 2  # only --verify takes several
