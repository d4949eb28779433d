"""The session event readers on the gateway: the cap as a setting, the figures on /metrics."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tokenwire.replay import SseStats
from tokenwire.services.gateway._observe.metrics import GatewayMetrics


def _samples(metrics: GatewayMetrics) -> dict[str, float]:
    text = metrics.render().decode()
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "reader" in s.name
    }


def test_readers_open_and_refused_follow_the_stats_at_each_scrape() -> None:
    stats = SseStats()
    metrics = GatewayMetrics(lambda: 0.0)
    metrics.watch_readers(stats)
    assert _samples(metrics)["tokenwire_gateway_readers_open"] == 0
    stats.clients, stats.refused, stats.lagged, stats.pauses = 3, 2, 1, 5
    got = _samples(metrics)
    assert got["tokenwire_gateway_readers_open"] == 3
    assert got["tokenwire_gateway_readers_refused_total"] == 2
    assert got["tokenwire_gateway_readers_lagged_total"] == 1
    assert got["tokenwire_gateway_reader_pauses_total"] == 5


def test_the_reader_cap_is_a_setting_of_at_least_one() -> None:
    from tokenwire.config import ConfigError
    from tokenwire.services.gateway import GatewaySettings

    assert GatewaySettings.from_env({}).max_readers == 256
    assert GatewaySettings.from_env({"TOKENWIRE_GATEWAY_MAX_READERS": "3"}).max_readers == 3
    with pytest.raises(ConfigError, match="TOKENWIRE_GATEWAY_MAX_READERS"):
        GatewaySettings.from_env({"TOKENWIRE_GATEWAY_MAX_READERS": "0"})
