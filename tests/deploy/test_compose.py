"""docker-compose.yml, checked statically (no Docker engine here) against the code and the
other deployment files: commands, ports, hosts, credentials, files, health and start order."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.deploy._files import (
    DEPLOY,
    ROOT,
    compose,
    env,
    healthcheck_url,
    load_yaml,
    nats_urls,
    parse_cli,
    port_of,
    services,
    tokenwire_services,
)
from tokenwire import config

REQUIRED = {
    "nats-1",
    "nats-2",
    "nats-3",
    "postgres",
    "provision",
    "gateway-1",
    "gateway-2",
    "lb",
    "assembler-1",
    "assembler-2",
    "telemetry",
    "scripted-provider",
    "prometheus",
    "otel-collector",
    "grafana",
}
TOKENWIRE = Path(sys.executable).parent / "tokenwire"


def test_compose_has_every_part_of_the_cluster() -> None:
    assert set(services()) >= REQUIRED


def _commands() -> list[str]:
    return sorted({s["command"][0] for s in tokenwire_services().values() if "command" in s})


@pytest.mark.slow
@pytest.mark.parametrize("command", _commands())
def test_every_service_command_is_a_tokenwire_subcommand(command: str) -> None:
    result = subprocess.run(
        [str(TOKENWIRE), command, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"tokenwire {command} --help: {result.stderr}"


@pytest.mark.parametrize(
    "name", sorted(n for n, s in tokenwire_services().items() if "command" in s)
)
def test_every_service_command_line_parses(name: str) -> None:
    """The command and every option compose passes exist and take the given values."""
    assert "entrypoint" not in tokenwire_services()[name]  # the image's: `tokenwire`
    parse_cli(tokenwire_services()[name]["command"])


def test_the_provision_service_runs_tokenwire_provision_with_a_cluster_sized_wait() -> None:
    provision = services()["provision"]
    assert provision["command"][0] == "provision"
    # Three fresh nodes elect a meta leader in seconds; the default 60 s is tight on a slow host.
    assert parse_cli(provision["command"])["timeout_s"] >= 60
    assert not (ROOT / "deploy" / "provision.py").exists()
    assert "provision.py" not in (ROOT / "Dockerfile").read_text()


def test_every_mounted_file_exists() -> None:
    for name, service in services().items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name}: {source}"


def test_every_dependency_condition_can_be_met() -> None:
    for name, service in services().items():
        for dep, cond in (service.get("depends_on") or {}).items():
            target = services()[dep]
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in target, f"{name} waits for {dep}'s health"
            if cond["condition"] == "service_completed_successfully":
                assert target.get("restart") == "no", f"{name} waits for {dep} to finish"


def test_every_long_running_tokenwire_service_has_a_health_check() -> None:
    for name, service in tokenwire_services().items():
        if service.get("restart") != "no":
            assert "healthcheck" in service, name


def _listen_port(name: str) -> int:
    """The port a service listens on, from its own configuration."""
    service, variables = services()[name], env(services()[name])
    if name.startswith("gateway"):
        return port_of(variables["TOKENWIRE_GATEWAY_ADDR"])
    if name.startswith("assembler"):
        return port_of(variables["TOKENWIRE_ASSEMBLER_METRICS_ADDR"])
    if name == "telemetry":
        return port_of(variables["TOKENWIRE_TELEMETRY_METRICS_ADDR"])
    if name == "scripted-provider":
        return int(service["command"][service["command"].index("--port") + 1])
    raise KeyError(name)


@pytest.mark.parametrize(
    "name",
    ["gateway-1", "gateway-2", "assembler-1", "assembler-2", "telemetry", "scripted-provider"],
)
def test_health_checks_probe_the_port_the_service_listens_on(name: str) -> None:
    url = urlsplit(healthcheck_url(services()[name]))
    assert url.port == _listen_port(name)
    assert url.hostname == "127.0.0.1"


def test_services_listen_beyond_loopback_and_gateways_require_keys() -> None:
    for name in ("gateway-1", "gateway-2"):
        variables = env(services()[name])
        assert variables["TOKENWIRE_GATEWAY_ADDR"].startswith("0.0.0.0:")
        assert variables["TOKENWIRE_GATEWAY_KEYS"]  # else the gateway refuses a non-loopback bind
    for name in ("assembler-1", "assembler-2"):
        assert env(services()[name])["TOKENWIRE_ASSEMBLER_METRICS_ADDR"].startswith("0.0.0.0:")


def test_settings_parse_with_the_real_config_loader() -> None:
    for name, service in tokenwire_services().items():
        variables = {k: re.sub(r"\$\{(\w+):-([^}]*)\}", r"\2", v) for k, v in env(service).items()}
        settings = config.load(variables)
        assert settings.partitions == 16, name
        if "TOKENWIRE_NATS_URL" in variables:
            assert len(settings.nats_urls) == 3, name


def test_nats_urls_use_each_services_own_user_on_all_three_nodes() -> None:
    expected_user = {
        "provision": "provisioner",
        "gateway-1": "gateway",
        "gateway-2": "gateway",
        "assembler-1": "assembler",
        "assembler-2": "assembler",
        "telemetry": "telemetry",
        "cli": "operator",
    }
    node_conf = (DEPLOY / "nats" / "nats-1.conf").read_text()
    client_port = port_of(re.search(r"^listen: (\S+)", node_conf, re.M).group(1))  # type: ignore[union-attr]  # the file is ours: a miss fails the test here
    for name, user in expected_user.items():
        urls = nats_urls(env(services()[name])["TOKENWIRE_NATS_URL"])
        assert {u for u, _, _, _ in urls} == {user}, name
        assert all(f"NATS_{user.upper()}_PASSWORD" in p for _, p, _, _ in urls), name
        assert sorted(h for _, _, h, _ in urls) == ["nats-1", "nats-2", "nats-3"], name
        assert {p for _, _, _, p in urls} == {client_port}, name


def test_nats_nodes_get_every_password_the_accounts_file_reads() -> None:
    accounts = (DEPLOY / "nats" / "accounts.conf").read_text()
    wanted = set(re.findall(r"password: \$(\w+)", accounts))
    for i in (1, 2, 3):
        assert wanted <= set(env(services()[f"nats-{i}"])), f"nats-{i}"


def test_nats_health_check_uses_the_monitoring_port_of_the_config() -> None:
    node_conf = (DEPLOY / "nats" / "nats-1.conf").read_text()
    http_port = port_of(re.search(r"^http: (\S+)", node_conf, re.M).group(1))  # type: ignore[union-attr]  # the file is ours: a miss fails the test here
    for i in (1, 2, 3):
        url = urlsplit(healthcheck_url(services()[f"nats-{i}"]))
        assert url.port == http_port
        assert "js-enabled-only=true" in url.query


def test_the_streams_run_at_three_replicas_on_three_nodes() -> None:
    for name in ("provision", "gateway-1", "assembler-1", "telemetry"):
        assert env(services()[name])["TOKENWIRE_REPLICAS"] == "3", name


def test_services_do_not_provision_under_least_privilege_users() -> None:
    for name in ("gateway-1", "gateway-2", "telemetry"):
        assert env(services()[name])["TOKENWIRE_PROVISION"] == "0", name
    for name in ("assembler-1", "assembler-2"):
        assert env(services()[name])["TOKENWIRE_ASSEMBLER_PROVISION"] == "0", name


def test_gateways_reach_the_scripted_provider_where_it_listens() -> None:
    url = urlsplit(env(services()["gateway-1"])["TOKENWIRE_SCRIPTED_BASE_URL"])
    assert url.hostname == "scripted-provider"
    assert url.port == _listen_port("scripted-provider")


def test_the_load_balancer_fronts_both_gateways_on_their_port() -> None:
    nginx = (DEPLOY / "nginx" / "nginx.conf").read_text()
    upstream = set(re.findall(r"server (gateway-\d):(\d+)", nginx))
    assert upstream == {(g, str(_listen_port(g))) for g in ("gateway-1", "gateway-2")}
    assert "proxy_buffering off" in nginx  # token streams pass through unbuffered
    listen = int(re.search(r"listen (\d+);", nginx).group(1))  # type: ignore[union-attr]  # the file is ours: a miss fails the test here
    assert any(p.endswith(f":{listen}") for p in services()["lb"]["ports"])


def test_prometheus_scrapes_every_service_where_it_listens() -> None:
    scrape = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")["scrape_configs"]
    targets = {t for job in scrape for sc in job["static_configs"] for t in sc["targets"]}
    for name in ("gateway-1", "gateway-2", "assembler-1", "assembler-2", "telemetry"):
        assert f"{name}:{_listen_port(name)}" in targets, name
    collector = load_yaml(DEPLOY / "otel" / "collector.yaml")
    assert f"otel-collector:{port_of(collector['exporters']['prometheus']['endpoint'])}" in targets
    for target in targets:
        host = target.split(":")[0]
        assert host == "localhost" or host in services(), target


@pytest.mark.parametrize("name", ["gateway-1", "gateway-2", "assembler-1", "telemetry"])
def test_every_service_exports_otlp_to_the_collectors_http_receiver(name: str) -> None:
    service_env = env(services()[name])
    url = urlsplit(service_env["OTEL_EXPORTER_OTLP_ENDPOINT"])
    collector = load_yaml(DEPLOY / "otel" / "collector.yaml")
    http = collector["receivers"]["otlp"]["protocols"]["http"]["endpoint"]
    assert url.hostname == "otel-collector"
    assert url.port == port_of(http)
    assert service_env["OTEL_SERVICE_NAME"] == "tokenwire-" + name.split("-", maxsplit=1)[0]


def test_grafana_mounts_what_its_provisioning_points_at() -> None:
    grafana = services()["grafana"]
    mounts = dict(v.split(":")[:2] for v in grafana["volumes"])
    provider = load_yaml(DEPLOY / "grafana" / "provisioning" / "dashboards" / "tokenwire.yaml")
    path = provider["providers"][0]["options"]["path"]
    assert mounts["./deploy/grafana/dashboards"] == path
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    datasource = load_yaml(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml")
    url = urlsplit(datasource["datasources"][0]["url"])
    assert url.hostname == "prometheus"
    assert any(p.endswith(f":{url.port}") for p in services()["prometheus"]["ports"])


def test_named_volumes_are_declared() -> None:
    declared = set(compose().get("volumes", {}))
    for name, service in services().items():
        for volume in service.get("volumes", []):
            source = volume.split(":", 1)[0]
            if not source.startswith(("./", "/")):
                assert source in declared, f"{name}: {source}"


def test_gateways_read_the_store_the_assemblers_write() -> None:
    """The session routes and /viewer (tokenwire.replay) read TOKENWIRE_STORE; without it a
    gateway would open an empty SQLite file in its container."""
    store = env(services()["assembler-1"])["TOKENWIRE_STORE"]
    assert urlsplit(store).hostname == "postgres"
    for name in ("gateway-1", "gateway-2", "cli"):
        assert env(services()[name])["TOKENWIRE_STORE"] == store, name
    for name in ("gateway-1", "gateway-2"):
        assert services()[name]["depends_on"]["postgres"]["condition"] == "service_healthy"
