"""deploy/prometheus/alerts.yml (issue 48): valid YAML in Prometheus's rule-file shape, loaded
by prometheus.yml and mounted by compose, every metric it queries exposed by a service's real
registry with the labels it groups and filters by, and the alerts the issue asks for there:
store lag, unowned partitions, services not ready."""

from __future__ import annotations

import re
from typing import Any

from tests.deploy._files import (
    DEPLOY,
    exposed_metric_labels,
    exposed_metric_names,
    load_yaml,
    metric_names_in,
    services,
)

ALERTS = DEPLOY / "prometheus" / "alerts.yml"
TARGET_LABELS = frozenset({"instance", "job"})
"""Labels Prometheus adds to every scraped sample (never exposed by the services)."""
_BY = re.compile(r"\bby \(([^)]*)\)")
_DURATION = re.compile(r"^\d+[smh]$")


def _rules() -> list[dict[str, Any]]:
    groups = load_yaml(ALERTS)["groups"]
    assert groups
    names = [g["name"] for g in groups]
    assert len(names) == len(set(names))
    return [rule for group in groups for rule in group["rules"]]


def test_the_rule_file_has_prometheus_s_shape() -> None:
    rules = _rules()
    alerts = [r["alert"] for r in rules]
    assert len(alerts) == len(set(alerts))
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert isinstance(rule["expr"], str)
        assert _DURATION.match(rule["for"]), rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]


def test_every_metric_an_alert_queries_is_exposed_with_its_labels() -> None:
    labels = exposed_metric_labels()
    for rule in _rules():
        expr = rule["expr"]
        used = metric_names_in(expr)
        assert used, rule["alert"]
        assert used <= exposed_metric_names(), (rule["alert"], used - exposed_metric_names())
        grouped = {x.strip() for b in _BY.findall(expr) for x in b.split(",") if x.strip()}
        available = set().union(*(labels[n] for n in used)) | TARGET_LABELS
        assert grouped <= available, (rule["alert"], grouped - available)
        for template in re.findall(r"\$labels\.([a-z_]+)", str(rule["annotations"])):
            assert template in grouped or template in TARGET_LABELS, (rule["alert"], template)


def test_the_alerts_the_issue_asks_for() -> None:
    exprs = {r["alert"]: r["expr"] for r in _rules()}
    assert "tokenwire_assembler_lag_seconds" in exprs["TokenwireStoreLag"]
    assert "tokenwire_assembler_unowned_partitions" in exprs["TokenwireUnownedPartitions"]
    for service in ("assembler", "gateway", "telemetry"):
        alert = f"Tokenwire{service.capitalize()}NotReady"
        assert f"tokenwire_{service}_not_ready" in exprs[alert]


def test_prometheus_loads_the_rules_and_compose_mounts_them() -> None:
    config = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    assert config["rule_files"] == ["alerts.yml"]  # beside prometheus.yml in the container
    volumes = services()["prometheus"]["volumes"]
    assert "./deploy/prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in volumes
