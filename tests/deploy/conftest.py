"""Fixtures of the deployment tests: the built package (once per session)."""

from __future__ import annotations

import pytest

from tests.deploy._wheel import Built, Installed, build, install


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="session")
def installed(built: Built, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    return install(built, tmp_path_factory.mktemp("wheel-venv"))
