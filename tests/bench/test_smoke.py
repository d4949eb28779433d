"""The benchmark harness does not rot: ``python -m bench --profile smoke`` runs the new parts end
to end (real nats-server, the whole stack as ``tokenwire up`` runs it, real sockets, SQLite)
and writes well-formed figures, docs and plots. No wall-clock target is asserted."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PARTS = ("limits", "stack", "interleaved", "telemetry", "scaling", "floor", "routes")
RUN_LIMIT_S = 600

# The first test's setup runs the whole benchmark (bounded by RUN_LIMIT_S): its bound, not the
# suite's per-test default, is the one that matters.
pytestmark = pytest.mark.timeout(RUN_LIMIT_S + 60)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench",
            "--profile",
            "smoke",
            "--no-peer",
            "--out",
            str(out),
            "--docs",
            str(out / "docs"),
            *PARTS,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def _figures(run: Path) -> dict[str, dict[str, float]]:
    doc = json.loads((run / "results.json").read_text())
    assert doc["profile"] == "smoke"
    assert set(PARTS) <= set(doc["seconds"])
    values: dict[str, dict[str, float]] = doc["values"]
    return values


@pytest.mark.slow
def test_every_figure_is_a_finite_number(run: Path) -> None:
    values = _figures(run)
    for phase, figures in values.items():
        for name, value in figures.items():
            assert isinstance(value, float), (phase, name, value)
            assert math.isfinite(value), (phase, name, value)


@pytest.mark.slow
def test_the_limits_and_tokenwire_figures_are_there_and_positive(run: Path) -> None:
    v = _figures(run)
    for name in (
        "publish_per_s",
        "consume_ack_per_s",
        "ordered_read_per_s",
        "json_loads_per_s",
        "proxy_events_per_s",
        "direct_ttfb_lone_p50_ms",
    ):
        assert v["limits"][name] > 0, name
    stack = v["stack"]
    for name in (
        "full_lone_through_p50_ms",
        "full_hot_through_p99_ms",
        "full_c1_events_per_s",
        "full_cmany_events_per_s",
        "full_cmany_cpu_ms_per_1k_gateway",
    ):
        assert stack[name] > 0, name
    # every chunk the gateway published was committed by the assembler of the same stack
    assert stack["chunks_committed"] == stack["chunks_on_stream"] > 0
    assert stack["telemetry_deliveries_per_step"] >= 1.0
    assert stack["marks_requests"] > 0
    assert stack["marks_provider_wait_to_headers_p50_ms"] > 0
    assert stack["marks_provider_post_to_wait_p50_ms"] > 0
    assert v["telemetry"]["deliveries_per_step"] == 1.0
    # issue 27's same-run baseline: the same build with frames off (one message per chunk)
    assert stack["v1_cmany_events_per_s"] > 0
    for tag in ("paced", "cmany"):
        assert (
            stack[f"v1_{tag}_messages_per_chunk"] >= 1.0 > stack[f"full_{tag}_messages_per_chunk"]
        )
        assert stack[f"v1_{tag}_bytes_per_chunk"] > stack[f"full_{tag}_bytes_per_chunk"] > 0
    # the same targets from alternating windows: both sides measured, every round
    interleaved = v["interleaved"]
    assert interleaved["rounds"] >= 1
    for side in ("full", "v1"):
        assert interleaved[f"{side}_cpu_ms_per_1k_total"] > 0, side
    # the gateway (as shipped and coalescing) and both relaying floors streamed the paced load
    floor = v["floor"]
    for side in ("gateway", "coalesced", "proxy", "relay"):
        assert floor[f"{side}_us_per_token"] > 0, side
    assert floor["gateway_over_gateway"] == 1.0


@pytest.mark.slow
def test_the_routes_part_measures_both_sides_of_every_pair(run: Path) -> None:
    """Issue 45's same-run figure: time to first byte through a routes file against
    provider/model, both measured in every pair (no target asserted: a wall-clock figure)."""
    routes = _figures(run)["routes"]
    assert routes["pairs"] >= 10
    for name in (
        "plain_ttfb_p50_ms",
        "routed_ttfb_p50_ms",
        "plain_cpu_us_per_request",
        "routed_cpu_us_per_request",
    ):
        assert routes[name] > 0, name
    assert math.isfinite(routes["added_p50_ms"])


@pytest.mark.slow
def test_the_docs_and_plots_are_written(run: Path) -> None:
    docs = run / "docs"
    text = (docs / "benchmarks.md").read_text()
    assert "<!-- BEGIN GENERATED: make bench -->" in text
    assert "<!-- END GENERATED: make bench -->" in text
    assert "Preliminary, measured under load" in text
    assert "peer skipped" in text
    images = sorted((docs / "img").glob("*.png"))
    assert len(images) >= 4
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in images)
    assert f"![{images[0].name}](img/{images[0].name})" in text
    capacity = (docs / "capacity.md").read_text()
    assert "100,000 concurrent sessions" in capacity
    assert "gateway processes" in capacity
    assert "| a TCP relay (uvloop protocols, parses nothing) |" in capacity
