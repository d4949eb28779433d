"""Every scaled service scales on a metric it exposes; the assemblers never beyond the
partitions (ADR 0016), and compose's scalable assembler stays within them too."""

from __future__ import annotations

from tests.deploy._files import exposed_metric_names, metric_names_in
from tests.deploy.test_k8s import _kind
from tokenwire.broker import Topology


def test_telemetry_and_gateways_scale_on_their_own_exposed_metrics() -> None:
    scaled = _kind("ScaledObject")
    deployments = _kind("Deployment")
    expected = {
        "tokenwire-telemetry": "tokenwire_telemetry_consumer_lag_messages",
        "tokenwire-gateway": "tokenwire_gateway_streams_in_flight",
    }
    for name, metric in expected.items():
        spec = scaled[name]["spec"]
        assert spec["scaleTargetRef"]["name"] == name
        assert name in deployments
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        (trigger,) = spec["triggers"]
        used = metric_names_in(trigger["metadata"]["query"])
        assert used == {metric}
        assert used <= exposed_metric_names()


def test_the_assembler_ceiling_is_the_partition_count() -> None:
    spec = _kind("ScaledObject")["tokenwire-assembler"]["spec"]
    assert spec["maxReplicaCount"] == Topology().partitions
