"""One settings table (tokenwire.variables) drives the flags, the variables and the docs."""

from __future__ import annotations

import os
import re
from pathlib import Path

import click
import pytest

from tokenwire.cli import main
from tokenwire.cli._app import COMMANDS, cli
from tokenwire.variables import VARIABLES, for_command, reference_markdown

ROOT = Path(__file__).resolve().parents[2]
VAR = re.compile(r"\bTOKENWIRE_[A-Z0-9_]*[A-Z0-9]\b")
NOT_VARIABLES = {"TOKENWIRE_EVENTS", "TOKENWIRE_DLQ", "TOKENWIRE_ASSEMBLER", "TOKENWIRE_GATEWAY"}
BASE_URL = re.compile(r"^TOKENWIRE_[A-Z0-9_]+_BASE_URL$")


def _command(name: str) -> click.Command:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None, name
    return command


def _flags(command: click.Command) -> set[str]:
    return {opt for p in command.params if isinstance(p, click.Option) for opt in p.opts}


def test_the_docs_carry_the_generated_reference() -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    block = re.search(r"<!-- settings:begin[^>]*-->\n(.*?)<!-- settings:end -->", text, re.S)
    assert block is not None, "docs/configuration.md lost its settings markers"
    assert block.group(1) == reference_markdown(), "regenerate: python -m tokenwire.variables"


def test_every_variable_the_code_reads_is_in_the_table() -> None:
    used: set[str] = set()
    for path in (ROOT / "src" / "tokenwire").rglob("*.py"):
        used |= set(VAR.findall(path.read_text()))
    rows = {v.env for v in VARIABLES}
    missing = {v for v in used - NOT_VARIABLES - rows if not BASE_URL.match(v)}
    assert missing == set()
    assert rows <= used, "a row names a variable nothing reads"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_command_has_a_flag_for_each_variable_it_reads(name: str) -> None:
    flags = _flags(_command(name))
    assert {f"--{v.flag}" for v in for_command(name)} <= flags


def test_every_row_names_real_commands_and_unique_flags() -> None:
    for v in VARIABLES:
        assert set(v.commands) <= set(COMMANDS), v.env
    for name in COMMANDS:
        flags = [v.flag for v in for_command(name)]
        assert len(flags) == len(set(flags)), name


def test_a_flag_is_the_variable_for_one_command_and_wins_over_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from_env, from_flag = tmp_path / "env.db", tmp_path / "flag.db"
    monkeypatch.setenv("TOKENWIRE_STORE", f"sqlite:///{from_env}")
    assert main(["messages", "nobody", "--store", f"sqlite:///{from_flag}"]) == 1
    err = capsys.readouterr().err
    assert str(from_flag) in err
    assert str(from_env) not in err
    assert os.environ["TOKENWIRE_STORE"] == f"sqlite:///{from_env}"  # put back after


def test_a_malformed_flag_is_reported_as_its_variable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", "--partitions", "lots", "--nats-url", "nats://127.0.0.1:1"]) == 2
    assert "TOKENWIRE_PARTITIONS='lots'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["demo", "--partitions", "0"], 2, "TOKENWIRE_PARTITIONS"),
        (["up", "--gateway-addr", "nowhere"], 2, "TOKENWIRE_GATEWAY_ADDR"),
        (["fold", "--provider", "nope-provider", str(ROOT / "README.md")], 2, "nope-provider"),
        (["scripted-provider", "--port", "70000"], 2, "70000"),
        (["provision"], 2, "TOKENWIRE_NATS_URL"),
        (["rebuild", "--session", "x"], 2, "TOKENWIRE_NATS_URL"),
        (["messages", "bad id!"], 2, "invalid session id"),
        (["no-such-command"], 2, "no-such-command"),
    ],
)
def test_exit_codes_of_the_remaining_commands(
    argv: list[str],
    code: int,
    says: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name in [k for k in os.environ if k.startswith("TOKENWIRE_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("TOKENWIRE_DATA_DIR", str(tmp_path))
    assert main(argv) == code
    assert says in capsys.readouterr().err
