"""Each setting is named, parsed and defaulted once: in its row of tokenwire.variables."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from tokenwire import config, variables
from tokenwire.broker import Topology, topology_from
from tokenwire.fold import DEFAULT_LIMITS
from tokenwire.services.assembler import AssemblerSettings
from tokenwire.services.gateway import GatewaySettings
from tokenwire.variables import VARIABLES, ConfigError, Variable

SRC = Path(__file__).resolve().parents[1] / "src" / "tokenwire"
CATALOGUE = SRC / "variables"
NAMES = {v.env for v in VARIABLES}
ROWS = {name: row for name, row in vars(variables).items() if isinstance(row, Variable)}
READ_ELSEWHERE = {"GATEWAY_DROP_PARAMS"}
"""Rows no settings class reads: the drop opt-in is read per request, with its per-provider
family (``TOKENWIRE_<PROVIDER>_DROP_PARAMS``), from the provider variables the gateway keeps."""


def _docstrings(tree: ast.Module) -> set[int]:
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, kinds)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def _named_variables(path: Path) -> list[str]:
    """The catalogued variables ``path`` spells out as a string (not in a docstring)."""
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    return [
        f"{node.value} (line {node.lineno})"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in NAMES and id(node) not in docs
    ]


def _modules() -> list[Path]:
    return [p for p in sorted(SRC.rglob("*.py")) if CATALOGUE not in p.parents]


def test_no_module_but_the_catalogue_names_a_variable() -> None:
    """A reader names a row (``PARTITIONS.read(env)``, ``PARTITIONS.env``), never the string:
    a second parser with a second default cannot appear unnoticed."""
    named = {str(p.relative_to(SRC)): found for p in _modules() if (found := _named_variables(p))}
    assert named == {}


def test_the_checker_sees_a_variable_spelled_out(tmp_path: Path) -> None:
    path = tmp_path / "reader.py"
    path.write_text('"""Reads TOKENWIRE_PARTITIONS."""\nenv.get("TOKENWIRE_PARTITIONS", "16")\n')
    assert _named_variables(path) == ["TOKENWIRE_PARTITIONS (line 2)"]


def _readers() -> dict[str, set[str]]:
    """Row name -> the modules that call its ``read``."""
    found: dict[str, set[str]] = {name: set() for name in ROWS}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "read":
                row = node.value
                name = row.attr if isinstance(row, ast.Attribute) else getattr(row, "id", "")
                if name in found:
                    found[name].add(str(path.relative_to(SRC)))
    return found


def test_each_row_is_read_in_exactly_one_module() -> None:
    readers = _readers()
    assert {name: mods for name, mods in readers.items() if len(mods) > 1} == {}
    assert {name for name, mods in readers.items() if not mods} == READ_ELSEWHERE


def test_the_table_lists_every_row_once() -> None:
    assert sorted(v.env for v in VARIABLES) == sorted(r.env for r in ROWS.values())
    assert len(NAMES) == len(VARIABLES)


@pytest.mark.parametrize("row", VARIABLES, ids=lambda v: v.env)
def test_each_default_parses_with_its_own_parser(row: Variable[object]) -> None:
    assert row.read({}) == row.value
    assert row.shown_default


CHECKED = [v for v in VARIABLES if v.default and v.parse is not variables.text]
"""Rows with a default whose text can be malformed (a free text, the data dir, cannot)."""


@pytest.mark.parametrize("row", CHECKED, ids=lambda v: v.env)
def test_a_malformed_value_is_refused_naming_the_variable(row: Variable[object]) -> None:
    with pytest.raises(ConfigError) as caught:
        row.read({row.env: "\x00not a value"})
    assert caught.value.name == row.env


def test_an_empty_environment_gives_each_settings_class_its_own_defaults() -> None:
    """The settings classes' field defaults come from the rows, so reading nothing gives
    exactly what building them with no arguments gives: one default each."""
    shared = config.load({})
    assert topology_from(shared) == Topology()
    read = dataclasses.replace(GatewaySettings.from_env({}), topology=None, store_url=None)
    assert read == GatewaySettings()
    url = "nats://127.0.0.1:4222"
    assembler = AssemblerSettings.from_env({variables.NATS_URL.env: url})
    assert assembler == AssemblerSettings(nats_urls=(url,), store_url=shared.store_url)


def test_the_gateways_step_byte_bound_is_the_folds() -> None:
    """The gateway ends a step before the fold would refuse it (docs/gateway.md)."""
    assert variables.GATEWAY_MAX_STEP_BYTES.value == DEFAULT_LIMITS.max_step_bytes


def _detail_defaults() -> list[tuple[str, str]]:
    """(variable, default cell) of docs/configuration.md's hand-written detail tables."""
    text = (SRC.parents[1] / "docs" / "configuration.md").read_text()
    detail = text.split("## Variables in detail", 1)[1]
    out: list[tuple[str, str]] = []
    for line in detail.splitlines():
        cells = [c.strip() for c in line.split("|")[1:3]] if line.startswith("| `") else []
        if len(cells) < 2 or cells[1] == "as above":
            continue
        names = [n.strip("` ") for n in cells[0].split(",")]
        shown = [d.strip() for d in cells[1].split(", ")]
        if len(names) == len(shown):
            out += [(n, d) for n, d in zip(names, shown, strict=True) if n in NAMES]
    return out


def test_the_detail_tables_show_each_rows_own_default() -> None:
    rows = {v.env: v for v in VARIABLES}
    found = _detail_defaults()
    assert len(found) > 30, "docs/configuration.md's detail tables changed shape"
    wrong = [(n, d) for n, d in found if not d.startswith(rows[n].shown_default)]
    assert wrong == []
