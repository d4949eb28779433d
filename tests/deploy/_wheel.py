"""The package as users get it: the wheel and sdist built from this checkout, and a fresh virtual
environment outside it with the wheel installed (the lock's versions, uv's cache).

Built once per session by the ``built`` and ``installed`` fixtures (tests/deploy/conftest.py).
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tests.deploy._files import ROOT

UV = ROOT / ".uv" / "bin" / "uv"
BUILD_LIMIT_S = 240
"""Bound of each build or install step (uv's cache makes them a few seconds when warm)."""


@dataclass(frozen=True)
class Built:
    wheel: Path
    sdist: Path

    def wheel_names(self) -> list[str]:
        with zipfile.ZipFile(self.wheel) as archive:
            return archive.namelist()

    def wheel_text(self, suffix: str) -> str:
        with zipfile.ZipFile(self.wheel) as archive:
            [name] = [n for n in archive.namelist() if n.endswith(suffix)]
            return archive.read(name).decode()


@dataclass(frozen=True)
class Installed:
    venv: Path

    @property
    def tokenwire(self) -> Path:
        return self.venv / "bin" / "tokenwire"


def _uv(*args: str, cwd: Path) -> None:
    subprocess.run(
        [str(UV), *args], cwd=cwd, check=True, timeout=BUILD_LIMIT_S, capture_output=True
    )


def build(out: Path) -> Built:
    """``uv build`` of the checkout: one sdist and one wheel in ``out``."""
    _uv("build", "--quiet", "--sdist", "--wheel", "--out-dir", str(out), str(ROOT), cwd=out)
    [wheel] = out.glob("tokenwire-*.whl")
    [sdist] = out.glob("tokenwire-*.tar.gz")
    return Built(wheel, sdist)


def install(built: Built, where: Path, extras: str = "demo") -> Installed:
    """A new virtual environment in ``where`` with ``tokenwire[extras]`` from the wheel, at the
    versions uv.lock pins (exported as constraints)."""
    constraints = where / "constraints.txt"
    _uv(
        "export",
        "--quiet",
        "--frozen",
        "--no-dev",
        "--all-extras",
        "--no-hashes",
        "--no-emit-project",
        "--project",
        str(ROOT),
        "--output-file",
        str(constraints),
        cwd=where,
    )
    venv = where / "venv"
    _uv("venv", "--quiet", "--python", sys.executable, str(venv), cwd=where)
    _uv(
        "pip",
        "install",
        "--quiet",
        "--python",
        str(venv / "bin" / "python"),
        "--constraints",
        str(constraints),
        f"{built.wheel}[{extras}]" if extras else str(built.wheel),
        cwd=where,
    )
    return Installed(venv)
