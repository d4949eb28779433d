"""The package as users install it: wheel and sdist built from the checkout, installed into a
fresh virtual environment outside it, run from there (``tokenwire --version``, the demo)."""

from __future__ import annotations

import os
import re
import subprocess
import tarfile
from email.parser import Parser
from importlib.metadata import version
from pathlib import Path

import pytest

from tests.deploy._files import ROOT
from tests.deploy._wheel import Built, Installed, install

pytestmark = pytest.mark.slow
RUN_LIMIT_S = 240


def _clean_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a user outside the checkout: no tokenwire settings, no PYTHONPATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TOKENWIRE_", "PYTHON", "VIRTUAL_ENV"))
    }
    return {**env, "TOKENWIRE_DATA_DIR": str(tmp_path / "data")}


def _run(exe: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(exe), *args],
        cwd=cwd,
        env=_clean_env(cwd),
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT_S,
        check=False,
    )


def test_the_wheel_carries_the_typed_package_its_data_and_metadata(built: Built) -> None:
    names = set(built.wheel_names())
    for needed in (
        "tokenwire/py.typed",
        "tokenwire/replay/viewer.html",
        "tokenwire/store/migrations/sqlite/0001_initial.sql",
        "tokenwire/store/migrations/postgres/0001_initial.sql",
    ):
        assert needed in names
    sources = {
        p.relative_to(ROOT / "src").as_posix()
        for p in (ROOT / "src" / "tokenwire").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert {n for n in names if n.startswith("tokenwire/")} == sources
    meta = Parser().parsestr(built.wheel_text(".dist-info/METADATA"))
    requires = meta.get_all("Requires-Dist") or []
    assert "nats-py<2.17,>=2.16" in requires
    assert any(r.startswith("uvloop") and "sys_platform != 'win32'" in r for r in requires)
    assert any(r.startswith("psycopg[binary]") and "extra == 'postgres'" in r for r in requires)
    assert any(r.startswith("openai") and "extra == 'demo'" in r for r in requires)
    assert set(meta.get_all("Provides-Extra") or []) == {"postgres", "demo"}
    assert "Typing :: Typed" in (meta.get_all("Classifier") or [])
    assert meta.get_all("Project-URL")
    assert meta["Keywords"]
    assert "tokenwire = tokenwire.cli:main" in built.wheel_text(".dist-info/entry_points.txt")


def test_the_sdist_builds_the_same_package(built: Built) -> None:
    with tarfile.open(built.sdist) as archive:
        names = {n.split("/", 1)[1] for n in archive.getnames() if "/" in n}
    assert {
        "pyproject.toml",
        "README.md",
        "src/tokenwire/py.typed",
        "src/tokenwire/replay/viewer.html",
    } <= names


def test_the_installed_wheel_runs_the_demo_outside_the_checkout(
    installed: Installed, tmp_path: Path
) -> None:
    assert not installed.venv.is_relative_to(ROOT)
    shown = _run(installed.tokenwire, "--version", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == f"tokenwire, version {version('tokenwire')}"
    where = subprocess.run(
        [str(installed.venv / "bin" / "python"), "-c", "import tokenwire as t; print(t.__file__)"],
        cwd=tmp_path,
        env=_clean_env(tmp_path),
        capture_output=True,
        text=True,
        check=True,
        timeout=RUN_LIMIT_S,
    )
    assert Path(where.stdout.strip()).is_relative_to(installed.venv)
    demo = _run(installed.tokenwire, "demo", "--sessions", "3", cwd=tmp_path)
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    assert re.search(r"replay --verify\s*│\s*passed", demo.stdout), demo.stdout[-3000:]


def test_without_extras_the_optional_parts_say_which_extra_they_need(
    built: Built, tmp_path_factory: pytest.TempPathFactory
) -> None:
    bare = install(built, tmp_path_factory.mktemp("bare-venv"), extras="")
    cwd = tmp_path_factory.mktemp("bare-run")
    helped = _run(bare.tokenwire, "--help", cwd=cwd)
    assert helped.returncode == 0, helped.stderr
    demo = _run(bare.tokenwire, "demo", "--sessions", "1", cwd=cwd)
    assert demo.returncode == 2, demo.stderr
    assert "pip install 'tokenwire[demo]'" in demo.stderr
    pg = _run(
        bare.tokenwire, "messages", "s-1", "--store", "postgresql://u@127.0.0.1:1/db", cwd=cwd
    )
    assert pg.returncode == 2, pg.stderr
    assert "pip install 'tokenwire[postgres]'" in pg.stderr
    sqlite = _run(bare.tokenwire, "messages", "s-1", cwd=cwd)
    assert sqlite.returncode == 1, sqlite.stderr  # the SQLite store needs nothing extra
    assert "no stored messages" in sqlite.stderr
