"""Dockerfile and .dockerignore: one image for every service, built from the lock file."""

from __future__ import annotations

import fnmatch
import re
import tomllib
from typing import Any

from packaging.markers import Marker
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

from tests.deploy._files import ROOT

DOCKERFILE = (ROOT / "Dockerfile").read_text()


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    lines = [
        ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")
    ]
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1]) for ln in lines]


def test_base_image_and_pinned_uv_match_the_makefile() -> None:
    uv_version = re.search(r"^UV_VERSION := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert uv_version is not None
    froms = [arg for op, arg in _instructions() if op == "FROM"]
    assert all(f.startswith("python:3.11-slim") for f in froms)
    assert f"pip install --no-cache-dir uv=={uv_version.group(1)}" in DOCKERFILE


def test_installs_from_the_lock_file_without_dev_dependencies() -> None:
    runs = [arg for op, arg in _instructions() if op == "RUN" and "uv sync" in arg]
    assert runs
    assert all("--frozen" in r and "--no-dev" in r for r in runs)


def test_runs_as_a_non_root_user_with_tokenwire_as_entrypoint() -> None:
    ops = _instructions()
    users = [arg for op, arg in ops if op == "USER"]
    assert users
    assert users[-1].split(":")[0] not in ("root", "0")
    assert [arg for op, arg in ops if op == "ENTRYPOINT"] == ['["tokenwire"]']


def _ignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pat = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pat) or path.startswith(pat + "/"):
            ignored = not negate
    return ignored


def test_every_copied_source_exists_and_is_not_dockerignored() -> None:
    patterns = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    copies = [arg for op, arg in _instructions() if op == "COPY" and "--from" not in arg]
    sources = [src for arg in copies for src in arg.split()[:-1]]
    assert "uv.lock" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not _ignored(source.rstrip("/"), patterns), source
    assert _ignored(".venv", patterns)
    assert _ignored("tests", patterns)


# python:3.11-slim is Debian bookworm: CPython 3.11, glibc 2.36; built for amd64 and arm64.
SLIM_GLIBC = (2, 36)
SLIM_ARCHES = ("x86_64", "aarch64")


def _slim_tags(arch: str) -> set[Tag]:
    platforms = [f"manylinux_2_{minor}_{arch}" for minor in range(SLIM_GLIBC[1], 4, -1)]
    platforms += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    py311 = (3, 11)
    return {
        *cpython_tags(py311, abis=["cp311", "abi3", "none"], platforms=platforms),
        *compatible_tags(py311, "cp311", platforms=platforms),
    }


def _runtime_packages() -> dict[str, dict[str, Any]]:
    """The packages `uv sync --no-dev` installs on Linux: the project's dependencies, their
    extras and theirs, transitively, from uv.lock (markers evaluated for Linux CPython 3.11)."""
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    by_name = {p["name"]: p for p in lock["package"]}
    env = {"sys_platform": "linux", "platform_system": "Linux", "python_version": "3.11",
           "python_full_version": "3.11.11", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "platform_machine": "x86_64"}  # fmt: skip
    project = by_name["tokenwire"]
    # The image installs the postgres extra (the cluster's store), not the demo extra.
    wanted = {}
    todo = [*project["dependencies"], *project["optional-dependencies"]["postgres"]]
    while todo:
        dep = todo.pop()
        if "marker" in dep and not Marker(dep["marker"]).evaluate({**env, "extra": ""}):
            continue
        package = by_name[dep["name"]]
        if dep["name"] not in wanted:
            wanted[dep["name"]] = package
            todo.extend(package.get("dependencies", []))
        for extra in dep.get("extra", []):
            todo.extend(package.get("optional-dependencies", {}).get(extra, []))
    return wanted


def test_every_runtime_dependency_installs_from_a_wheel_on_the_slim_base() -> None:
    """No dependency builds from source in the image (the slim base has no compiler): each
    locked runtime package, uvloop and httptools included, has a wheel for both arches."""
    packages = _runtime_packages()
    assert {"uvloop", "httptools", "msgspec", "nats-py"} <= set(packages)
    for arch in SLIM_ARCHES:
        supported = _slim_tags(arch)
        for name, package in packages.items():
            wheels = [w["url"].rsplit("/", 1)[1] for w in package.get("wheels", [])]
            tags = {t for w in wheels for t in parse_wheel_filename(w)[3]}
            assert tags & supported, f"{name}: no wheel for CPython 3.11 on {arch} glibc"
