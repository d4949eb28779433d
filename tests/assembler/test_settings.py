"""AssemblerSettings from the environment."""

from __future__ import annotations

import pytest

from tokenwire.config import ConfigError
from tokenwire.services.assembler import AssemblerSettings


def test_defaults_and_overrides() -> None:
    s = AssemblerSettings.from_env({"TOKENWIRE_NATS_URL": "nats://a:1,nats://b:2"})
    assert s.nats_urls == ("nats://a:1", "nats://b:2")
    assert s.store_url == "sqlite:///.tokenwire/store.db"
    assert (s.batch_max_steps, s.batch_max_s, s.metrics_addr) == (256, 0.02, ("127.0.0.1", 9465))
    assert (s.assembly.gap_timeout_s, s.assembly.abandon_timeout_s) == (30.0, 120.0)
    assert (s.topology.partitions, s.provision, s.burst, s.tune_gc) == (16, True, False, True)
    s = AssemblerSettings.from_env(
        {
            "TOKENWIRE_NATS_URL": "nats://a:1",
            "TOKENWIRE_PARTITIONS": "4",
            "TOKENWIRE_ASSEMBLER_BATCH_STEPS": "10",
            "TOKENWIRE_ASSEMBLER_BATCH_MS": "5",
            "TOKENWIRE_ASSEMBLER_ABANDON_TIMEOUT_S": "2.5",
            "TOKENWIRE_ASSEMBLER_MAX_OPEN_STEPS": "7",
            "TOKENWIRE_ASSEMBLER_METRICS_ADDR": "off",
            "TOKENWIRE_ASSEMBLER_BURST": "1",
            "TOKENWIRE_ASSEMBLER_PROVISION": "0",
            "TOKENWIRE_ASSEMBLER_TUNE_GC": "0",
        }
    )
    assert (s.topology.partitions, s.batch_max_steps, s.batch_max_s) == (4, 10, 0.005)
    assert (s.assembly.abandon_timeout_s, s.assembly.max_open_steps) == (2.5, 7)
    assert (s.metrics_addr, s.burst, s.provision, s.tune_gc) == (None, True, False, False)


@pytest.mark.parametrize(
    ("env", "name"),
    [
        ({}, "TOKENWIRE_NATS_URL"),
        ({"TOKENWIRE_ASSEMBLER_BATCH_STEPS": "0"}, "TOKENWIRE_ASSEMBLER_BATCH_STEPS"),
        ({"TOKENWIRE_ASSEMBLER_GAP_TIMEOUT_S": "soon"}, "TOKENWIRE_ASSEMBLER_GAP_TIMEOUT_S"),
        ({"TOKENWIRE_ASSEMBLER_METRICS_ADDR": "nowhere"}, "TOKENWIRE_ASSEMBLER_METRICS_ADDR"),
        ({"TOKENWIRE_ASSEMBLER_BURST": "maybe"}, "TOKENWIRE_ASSEMBLER_BURST"),
    ],
)
def test_bad_values_name_the_variable(env: dict[str, str], name: str) -> None:
    full = {"TOKENWIRE_NATS_URL": "nats://a:1", **env} if name != "TOKENWIRE_NATS_URL" else env
    with pytest.raises(ConfigError) as info:
        AssemblerSettings.from_env(full)
    assert info.value.name == name
