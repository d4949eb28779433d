"""Loading the deployment files, and the facts about the code they must agree with."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
NATS_DIR = DEPLOY / "nats"
K8S = DEPLOY / "k8s"
NATS_USERS = ("sys", "provisioner", "gateway", "assembler", "telemetry", "operator")


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_all_yaml(path: Path) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


@cache
def compose() -> dict[str, Any]:
    data: dict[str, Any] = load_yaml(ROOT / "docker-compose.yml")
    return data


def services() -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = compose()["services"]
    return result


def tokenwire_services() -> dict[str, dict[str, Any]]:
    """The compose services that run the tokenwire image."""
    return {k: v for k, v in services().items() if v.get("image") == "tokenwire:local"}


def env(service: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in (service.get("environment") or {}).items()}


def port_of(addr: str) -> int:
    return int(addr.rsplit(":", 1)[1])


def healthcheck_url(service: dict[str, Any]) -> str:
    """The URL a compose health check probes (wget or python urllib)."""
    text = " ".join(service["healthcheck"]["test"])
    match = re.search(r"http://[^\s'\"]+", text)
    assert match, f"no URL in health check {text!r}"
    return match.group(0)


def nats_urls(value: str) -> list[tuple[str, str, str, int]]:
    """``(user, password, host, port)`` of each comma-separated NATS URL."""
    out = []
    for url in value.split(","):
        parts = urlsplit(url)
        assert parts.scheme == "nats", url
        assert parts.hostname, url
        assert parts.port, url
        out.append((parts.username or "", parts.password or "", parts.hostname, parts.port))
    return out


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        (DEPLOY / "grafana" / "dashboards" / "tokenwire.json").read_text()
    )
    return data


def panels(dash: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dash["panels"]:
        yield panel
        yield from panel.get("panels", [])


@cache
def exposed_metric_names() -> frozenset[str]:
    """Every sample name the three services' Prometheus registries can expose.

    Built from the real metric classes (not from grepping), so a renamed metric fails here.
    """
    from tokenwire.services.assembler import AssemblerMetrics
    from tokenwire.services.gateway._observe.metrics import GatewayMetrics
    from tokenwire.services.telemetry import TelemetryMetrics

    registries = [
        AssemblerMetrics().registry,
        GatewayMetrics(lambda: 0.0).registry,
        TelemetryMetrics().registry,
    ]
    suffixes = {
        "counter": ("_total", "_created"),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "gauge": ("",),
        "summary": ("", "_sum", "_count", "_created"),
    }
    names: set[str] = set()
    for registry in registries:
        for family in registry.collect():
            names.update(family.name + s for s in suffixes[family.type])
    return frozenset(names)


def exposed_metric_labels() -> dict[str, frozenset[str]]:
    """The label names of every exposed sample name (``le`` on histogram buckets), read off the
    real metric objects (a labelled metric with no series yet has no samples to read them from).
    """
    from tokenwire.services.assembler import AssemblerMetrics
    from tokenwire.services.gateway._observe.metrics import GatewayMetrics
    from tokenwire.services.telemetry import TelemetryMetrics

    suffixes = {
        "counter": ("_total",),
        "histogram": ("_bucket", "_sum", "_count"),
        "gauge": ("",),
    }
    out: dict[str, frozenset[str]] = {}
    for registry in (
        AssemblerMetrics().registry,
        GatewayMetrics(lambda: 0.0).registry,
        TelemetryMetrics().registry,
    ):
        for metric in registry._collector_to_names:
            if not hasattr(metric, "_name"):  # a custom collector (e.g. the gateway's readers)
                for family in metric.collect():
                    # the labels a family declares (its series may be none yet)
                    declared = frozenset(getattr(family, "_labelnames", ()))
                    for suffix in suffixes.get(family.type, ("",)):
                        out[family.name + suffix] = declared
                continue
            name = metric._name  # private in prometheus_client (hasattr above)
            labels = frozenset(metric._labelnames)  # type: ignore[attr-defined]  # prometheus_client keeps a metric's labels private
            for suffix in suffixes.get(metric._type, ("",)):  # type: ignore[attr-defined]  # prometheus_client keeps a metric's type private
                extra = {"le"} if suffix == "_bucket" else set()
                out[name.removesuffix("_total") + suffix] = labels | extra
    return out


METRIC_RE = re.compile(r"\btokenwire_[a-z0-9_]+")


def metric_names_in(text: str) -> set[str]:
    return set(METRIC_RE.findall(text))


def parse_cli(args: list[str]) -> dict[str, Any]:
    """The parameters ``tokenwire ARGS`` would run with, parsed by the real command group
    without invoking it (an unknown command or option, or a bad value, raises UsageError)."""
    import click

    from tokenwire.cli._app import _register, cli

    _register()
    root = click.Context(cli, info_name="tokenwire", obj={})
    command = cli.get_command(root, args[0])
    if command is None:
        raise click.UsageError(f"no command {args[0]!r} in `tokenwire --help`")
    params: dict[str, Any] = command.make_context(args[0], args[1:], parent=root).params
    return params
