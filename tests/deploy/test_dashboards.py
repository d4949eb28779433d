"""The Grafana dashboard and the Prometheus configuration refer to metrics the services
really expose (from their registries), and show what the telemetry issue asks for."""

from __future__ import annotations

import re

from tests.deploy._files import (
    DEPLOY,
    dashboard,
    exposed_metric_labels,
    exposed_metric_names,
    load_yaml,
    metric_names_in,
    panels,
)


def _exprs() -> dict[str, list[str]]:
    return {
        p["title"]: [t["expr"] for t in p.get("targets", [])]
        for p in panels(dashboard())
        if p["type"] != "row"
    }


def test_every_metric_the_dashboard_queries_is_exposed() -> None:
    used = set().union(*(metric_names_in(e) for es in _exprs().values() for e in es))
    used |= metric_names_in(str(dashboard()["templating"]))
    assert used
    assert used - exposed_metric_names() == set()


_BY = re.compile(r"\bby \(([^)]*)\)")
_MATCHER = re.compile(r"([a-z_]+)\s*=~?\s*\"")


def test_every_label_the_dashboard_groups_or_filters_by_exists_on_its_metric() -> None:
    labels = exposed_metric_labels()
    for title, exprs in _exprs().items():
        for expr in exprs:
            for name, matchers in re.findall(r"(tokenwire_[a-z0-9_]+)(\{[^}]*\})?", expr):
                assert name in labels, (title, name)
                used = set(_MATCHER.findall(matchers))
                assert used <= labels[name], (title, name, used - labels[name])
            grouped = {x.strip() for b in _BY.findall(expr) for x in b.split(",") if x.strip()}
            available = set().union(*(labels[n] for n in metric_names_in(expr)))
            assert grouped <= available, (title, grouped - available)


def test_model_call_panels_show_what_the_issue_asks_for() -> None:
    ttfc = r"rate\(tokenwire_gateway_time_to_first_chunk_seconds_bucket"
    for q in ("0.5", "0.99"):
        assert _panel_with(rf"histogram_quantile\({q}, sum by \(provider, model, le\) \({ttfc}")
    assert _panel_with(r"sum by \(provider, model, type\) \(rate\(tokenwire_gateway_tokens_total")
    assert _panel_with(
        r"sum by \(provider, error_type\) \(rate\(tokenwire_gateway_call_errors_total"
    )
    assert _panel_with(r"sum by \(provider, outcome\) \(rate\(tokenwire_gateway_calls_total")
    assert _panel_with(r"min\(tokenwire_assembler_store_up\)")


def _panel_with(pattern: str) -> list[str]:
    return [t for t, es in _exprs().items() if any(re.search(pattern, e) for e in es)]


def test_time_to_first_chunk_p50_and_p99_by_provider_and_model() -> None:
    for q in ("0.5", "0.99"):
        pattern = (
            rf"histogram_quantile\({q}, sum by \(provider, model, le\) "
            r"\(rate\(tokenwire_time_to_first_chunk_seconds_bucket"
        )
        assert _panel_with(pattern), q


def test_stream_starts_errors_and_lag_panels() -> None:
    assert _panel_with(r"sum by \(provider, model\) \(rate\(tokenwire_stream_starts_total")
    assert _panel_with(r"sum by \(kind\) \(rate\(tokenwire_assembler_errors_total")
    assert _panel_with(r"max by \(partition\) \(tokenwire_assembler_lag_messages\)")


def test_panels_use_the_provisioned_datasource_and_have_unique_ids() -> None:
    datasource = load_yaml(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml")
    uid = datasource["datasources"][0]["uid"]
    ids = [p["id"] for p in panels(dashboard())]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard()):
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == uid, panel["title"]


def test_collector_pipelines_use_only_defined_components() -> None:
    collector = load_yaml(DEPLOY / "otel" / "collector.yaml")
    for name, pipeline in collector["service"]["pipelines"].items():
        for kind in ("receivers", "processors", "exporters"):
            for component in pipeline.get(kind, []):
                assert component in collector[kind], f"{name}: {component}"
    assert set(collector["service"]["extensions"]) <= set(collector["extensions"])


def test_prometheus_jobs_have_unique_names() -> None:
    jobs = [
        j["job_name"] for j in load_yaml(DEPLOY / "prometheus" / "prometheus.yml")["scrape_configs"]
    ]
    assert len(jobs) == len(set(jobs))


def test_usage_and_cost_panels_read_the_ledger_counters() -> None:
    assert _panel_with(
        r"sum by \(tenant, provider, model\) \(rate\(tokenwire_assembler_usage_cost_usd_total"
    )
    assert _panel_with(r"sum by \(tenant, type\) \(rate\(tokenwire_assembler_usage_tokens_total")
    assert _panel_with(r"rate\(tokenwire_assembler_usage_unpriced_steps_total")
