"""The routes in force: the routes file compiled into groups of deployments with their Routes,
replaced whole when the file changes (docs/gateway.md, "Routes").

:class:`RouteTable` is what a request reads (one dict lookup by public name); it holds the
compiled file and :meth:`RouteTable.reload_if_changed` swaps in a new one when the file's
modification time or size moved and the new file checks; a file that does not check keeps the
table in force, and the error is kept for the log, the metrics and ``GET /v1/models``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from tokenwire.providers import Dialect
from tokenwire.scrub import register
from tokenwire.services.gateway._dialects.base import CallerDialect
from tokenwire.services.gateway._routing.routes_file import (
    DeploymentSpec,
    GroupSpec,
    RoutesConfig,
    RoutesFileError,
    load_routes,
)
from tokenwire.services.gateway._routing.routing import Route, deployment_route

log = logging.getLogger("tokenwire.gateway")
_CALLERS: tuple[CallerDialect, ...] = (
    Dialect.OPENAI_CHAT,
    Dialect.ANTHROPIC_MESSAGES,
    Dialect.OPENAI_RESPONSES,
)


@dataclass(frozen=True, slots=True)
class Deployment:
    """A deployment of a group, with its Route for each caller dialect (built once)."""

    spec: DeploymentSpec
    group: GroupSpec
    routes: Mapping[CallerDialect, Route]
    weight: float


@dataclass(frozen=True, slots=True)
class Group:
    """A public model name, compiled: its deployments and its fallbacks' names."""

    spec: GroupSpec
    deployments: tuple[Deployment, ...]

    @property
    def name(self) -> str:
        """The public name."""
        return self.spec.name


def compile_routes(config: RoutesConfig | None) -> dict[str, Group]:
    """Every group of ``config`` with its deployments' Routes."""
    if config is None:
        return {}
    groups = {}
    for spec in config.groups.values():
        deployments = tuple(
            Deployment(
                d, spec, {caller: deployment_route(d, caller) for caller in _CALLERS}, d.weight
            )
            for d in spec.deployments
        )
        groups[spec.name] = Group(spec, deployments)
    return groups


class RouteTable:
    """The routes in force (see the module). ``env`` holds the credentials a reload reads."""

    def __init__(self, config: RoutesConfig | None, env: Mapping[str, str] | None = None) -> None:
        self.config = config
        self._env = os.environ if env is None else env
        self._groups = compile_routes(config)
        self._seen = _stamp(config.path) if config is not None else None
        self.reloads = 0
        self.reload_errors = 0
        self.last_error: str | None = None
        if config is not None:
            register(*config.secrets())

    def group(self, name: str) -> Group | None:
        """The group of a public name, None when the name is not one."""
        return self._groups.get(name)

    def names(self) -> list[str]:
        """The public names, in file order."""
        return list(self._groups)

    @property
    def deployment_names(self) -> list[str]:
        """Every deployment's name, in file order."""
        return [d.spec.name for g in self._groups.values() for d in g.deployments]

    def reload_if_changed(self) -> bool:
        """Load the file again when its modification time or size changed; True when a new
        table is in force. A file that does not check (or cannot be read) keeps the old one."""
        if self.config is None:
            return False
        path = self.config.path
        stamp = _stamp(path)
        if stamp == self._seen:
            return False
        self._seen = stamp
        try:
            config = load_routes(path, self._env)
        except RoutesFileError as exc:
            self.reload_errors += 1
            self.last_error = str(exc)
            log.error("routes file not reloaded, the routes in force stay: %s", exc)
            return False
        register(*config.secrets())
        self.config, self._groups = config, compile_routes(config)
        self.reloads += 1
        self.last_error = None
        log.warning(
            "routes file reloaded: %d models, %d deployments",
            len(self._groups),
            len(self.deployment_names),
        )
        return True


def _stamp(path: str) -> tuple[int, int] | None:
    """The file's modification time (ns) and size, None when it cannot be read."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_mtime_ns, stat.st_size
