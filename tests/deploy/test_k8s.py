"""deploy/k8s: the manifests parse, are complete, and agree with each other, with the CLI and
with the metrics the services expose (no cluster here: checked statically)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.deploy._files import (
    K8S,
    NATS_DIR,
    exposed_metric_names,
    load_all_yaml,
    load_yaml,
    metric_names_in,
    parse_cli,
)
from tokenwire.broker import Topology

SERVICE_COMMANDS = {"gateway", "assembler", "telemetry"}


def _resources() -> list[dict[str, Any]]:
    kustomization = load_yaml(K8S / "kustomization.yaml")
    docs: list[dict[str, Any]] = []
    for name in kustomization["resources"]:
        docs.extend(load_all_yaml(K8S / name))
    return docs


def _kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in _resources() if d["kind"] == kind}


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def test_every_document_has_api_version_kind_and_name() -> None:
    manifests = set(K8S.glob("*.yaml")) - {K8S / "kustomization.yaml", K8S / "nats-values.yaml"}
    for path in sorted(manifests):
        for doc in load_all_yaml(path):
            assert {"apiVersion", "kind", "metadata"} <= set(doc), path.name
            assert doc["metadata"].get("name"), path.name


def test_kustomization_lists_every_manifest_but_the_helm_values() -> None:
    listed = set(load_yaml(K8S / "kustomization.yaml")["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "nats-values.yaml"}
    assert listed == present


def test_deployments_select_their_own_pods_and_run_a_tokenwire_service() -> None:
    deployments = _kind("Deployment")
    assert set(deployments) == {f"tokenwire-{c}" for c in SERVICE_COMMANDS}
    for name, deployment in deployments.items():
        selector = deployment["spec"]["selector"]["matchLabels"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), name
        container = _container(deployment)
        assert container["args"][0] == name.removeprefix("tokenwire-")
        resources = container["resources"]
        assert resources["requests"]["cpu"], name
        assert resources["requests"]["memory"], name
        assert resources["limits"]["memory"], name


def _ports(container: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in container["ports"]}


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


@pytest.mark.parametrize(
    ("name", "variable"),
    [
        ("tokenwire-gateway", "TOKENWIRE_GATEWAY_ADDR"),
        ("tokenwire-assembler", "TOKENWIRE_ASSEMBLER_METRICS_ADDR"),
        ("tokenwire-telemetry", "TOKENWIRE_TELEMETRY_METRICS_ADDR"),
    ],
)
def test_probes_and_scrapes_use_the_port_the_service_listens_on(name: str, variable: str) -> None:
    deployment = _kind("Deployment")[name]
    container = _container(deployment)
    addr = _env(container)[variable]
    assert addr.startswith("0.0.0.0:")
    port = int(addr.rsplit(":", 1)[1])
    ports = _ports(container)
    assert list(ports.values()) == [port]
    for probe in ("readinessProbe", "livenessProbe"):
        assert ports[container[probe]["httpGet"]["port"]] == port, probe
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(port)


def test_gateway_probes_readyz_and_healthz() -> None:
    container = _container(_kind("Deployment")["tokenwire-gateway"])
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_services_select_deployments_and_target_named_ports() -> None:
    deployments = _kind("Deployment").values()
    for name, service in _kind("Service").items():
        selector = service["spec"]["selector"]
        matches = [
            d
            for d in deployments
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert len(matches) == 1, name
        ports = _ports(_container(matches[0]))
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports, name


def test_every_pod_reads_the_shared_config_and_its_own_secret() -> None:
    pods = [d["spec"]["template"] for d in _kind("Deployment").values()]
    pods += [j["spec"]["template"] for j in _kind("Job").values()]
    for pod in pods:
        refs = [next(iter(r.values()))["name"] for r in pod["spec"]["containers"][0]["envFrom"]]
        assert refs[0] == "tokenwire-config"
        assert refs[1].startswith("tokenwire-")
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True


def test_shared_config_runs_three_replicas_without_provisioning_in_the_services() -> None:
    data = _kind("ConfigMap")["tokenwire-config"]["data"]
    assert data["TOKENWIRE_REPLICAS"] == "3"
    assert data["TOKENWIRE_PROVISION"] == "0"
    assert data["TOKENWIRE_ASSEMBLER_PROVISION"] == "0"


def test_the_provision_job_runs_tokenwire_provision_with_a_cluster_sized_wait() -> None:
    container = _kind("Job")["tokenwire-provision"]["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container  # the image's entrypoint: `tokenwire`
    assert container["args"][0] == "provision"
    assert parse_cli(container["args"])["timeout_s"] >= 60


@pytest.mark.parametrize("kind", ["Deployment", "Job"])
def test_every_container_command_line_parses(kind: str) -> None:
    for name, workload in _kind(kind).items():
        container = _container(workload)
        assert "command" not in container, name
        parse_cli(container["args"])


def test_keda_scales_the_assembler_on_an_exposed_lag_metric_up_to_the_partitions() -> None:
    scaled = _kind("ScaledObject")["tokenwire-assembler"]
    spec = scaled["spec"]
    assert spec["scaleTargetRef"]["name"] in _kind("Deployment")
    partitions = int(_kind("ConfigMap")["tokenwire-config"]["data"]["TOKENWIRE_PARTITIONS"])
    assert partitions == Topology().partitions
    assert 2 <= spec["minReplicaCount"] <= spec["maxReplicaCount"] <= partitions
    (trigger,) = spec["triggers"]
    assert trigger["type"] == "prometheus"
    used = metric_names_in(trigger["metadata"]["query"])
    assert used == {"tokenwire_assembler_lag_messages"}
    assert used <= exposed_metric_names()


def test_nats_values_run_a_three_node_jetstream_cluster_on_file_storage() -> None:
    values = load_yaml(K8S / "nats-values.yaml")
    cfg = values["config"]
    assert cfg["cluster"]["enabled"] is True
    assert cfg["cluster"]["replicas"] == 3
    assert cfg["jetstream"]["enabled"] is True
    assert cfg["jetstream"]["fileStore"]["enabled"] is True
    assert cfg["jetstream"]["fileStore"]["pvc"]["enabled"] is True
    include = cfg["merge"]["$include"]
    mount = values["container"]["patch"][0]["value"]
    assert f"/etc/nats-config/{include}".startswith(mount["mountPath"] + "/")
    volume = values["podTemplate"]["patch"][0]["value"]
    assert volume["name"] == mount["name"]
    assert volume["configMap"]["name"] == "nats-tokenwire-accounts"


def test_nats_values_pass_every_password_the_accounts_file_reads() -> None:
    wanted = set(re.findall(r"password: \$(\w+)", (NATS_DIR / "accounts.conf").read_text()))
    env = load_yaml(K8S / "nats-values.yaml")["container"]["env"]
    assert set(env) == wanted
