"""The capacity model's arithmetic (bench/capacity.py) against hand-computed figures: the
inputs are chosen round so that every expected value below is worked out in its comment."""

from __future__ import annotations

from bench._suite import Figures

from bench import _capacity_inputs, bench_floor, capacity


def _figures(loads: dict[int, float]) -> Figures:
    """A paced phase with one load per entry (sessions -> pace kept) and a shards phase."""
    fig = Figures("default")
    for n, pace in loads.items():
        for name, value in {
            "sessions": n,
            "pace": pace,
            "chunks_per_step": 100.0,
            "cpu_us_per_chunk_gateway": 60.0 if n == 100 else 90.0,
            "cpu_us_per_chunk_assembler": 12.0,
            "cpu_us_per_chunk_telemetry": 3.0,
            "cpu_us_per_chunk_nats": 10.0,
            "messages_per_chunk": 0.2,
            "stream_bytes_per_chunk": 100.0,
            "kv_writes_per_step": 2.0,
            "event_writes_per_step": 2.0,
        }.items():
            fig.put("paced", f"s{n}_{name}", value)
    fig.put("paced", "disk_bytes_per_chunk", 25.0)
    for name, value in {
        "k1f_cpu_us_per_message_all_nodes": 50.0,
        "r1f_cpu_us_per_message_all_nodes": 20.0,
        "k1f_leader_node_cpu_us_per_message": 20.0,
        "kv_leader_node_cpu_us_per_step": 40.0,
        "kv_cpu_us_per_step_all_nodes": 100.0,
        "consume_cpu_us_per_message_all_nodes": 30.0,
        "consume_max_node_cpu_us_per_message": 25.0,
    }.items():
        fig.put("shards", name, value)
    return fig


def test_the_plan_from_round_inputs() -> None:
    x = _capacity_inputs.paced_inputs(_figures({100: 1.0}))
    p = capacity.plan(x)
    # 5,000,000 chunks/s; cores at 60 %: gateway 5e6 * 60e-6 / 0.6 = 500, assembler 100,
    # telemetry 25
    assert (p.cores["gateway"], p.cores["assembler"], p.cores["telemetry"]) == (500, 100, 25)
    # broker per chunk, all nodes: 0.2 * (50 + 30) + (100 + 30 + 2 * 50) / 100 = 18.3 us
    # -> 5e6 * 18.3e-6 / 0.6 = 152.5 cores -> 20 nodes of 8 -> 160 cores
    assert (p.nodes, p.cores["broker"]) == (20, 160)
    # a leader per chunk: 0.2 * (20 + 25) = 9 us -> 5e6 * 9e-6 / 0.5 = 90 streams (>= 20 nodes)
    assert p.streams == 90
    assert p.total == 500 + 100 + 25 + 160
    # 5e6 / 100 chunks per step = 50,000 steps/s x 40 us on the bucket's leader = 2 cores
    assert abs(p.kv_leader_share - 2.0) < 1e-9
    # the events: 50,000 steps/s x 2 writes x 20 us on a stream leader = 2 cores
    assert abs(p.events_leader_share - 2.0) < 1e-9
    # R shards both: 2 cores / 0.5 core per leader = 4 buckets and 4 events streams
    assert capacity.registry_shards_for(p.kv_leader_share, p.events_leader_share) == 4
    assert capacity.registry_shards_for(0.5, 0.6) == 2  # the busier of the two decides
    assert capacity.registry_shards_for(0.1, 0.2) == 1


def test_the_model_takes_the_busiest_load_that_kept_pace() -> None:
    assert _capacity_inputs.paced_load(_figures({100: 1.0, 200: 0.90})) == 100
    assert _capacity_inputs.paced_load(_figures({100: 1.0, 200: 0.96})) == 200
    assert (
        _capacity_inputs.paced_load(_figures({100: 0.5, 200: 0.4})) == 100
    )  # none kept: the fewest
    assert _capacity_inputs.paced_load(Figures("default")) is None


def test_the_retention_table() -> None:
    fig = _figures({100: 1.0})
    rows = capacity._retention(fig, _capacity_inputs.paced_inputs(fig))
    # 1,000 sessions x 50 chunks/s x 100 B = 5 MB/s: 1 GiB lasts 1073741824 / 5e6 = 214.7 s;
    # disk at 25 B: 858.99 s = 14.3 min; a day: 5e6 * 86400 / 2**30 = 402 GiB of budget
    assert (
        "| 1,000 | paced run (scripted provider's text) | 5.00 MB/s | 3.6 min | 0.05965 "
        in (rows[2])
    )
    assert "| 402 GiB | 14.3 min |" in rows[2]


def test_without_the_paced_phase_the_document_says_so() -> None:
    text = capacity.render(Figures("smoke"))
    assert "The paced phase is not in these figures" in text
    assert "100,000 concurrent sessions" in text


def _with_frames_off(fig: Figures) -> Figures:
    """The paced phase's frames-off pass (``v1_`` keys) at the same load: one message per
    chunk, the other per-chunk figures as the frames-on pass's; the cluster's v1 costs."""
    for name, value in {
        "sessions": 100,
        "pace": 1.0,
        "chunks_per_step": 100.0,
        "cpu_us_per_chunk_gateway": 60.0,
        "cpu_us_per_chunk_assembler": 12.0,
        "cpu_us_per_chunk_telemetry": 3.0,
        "cpu_us_per_chunk_nats": 10.0,
        "messages_per_chunk": 1.0,
        "stream_bytes_per_chunk": 400.0,
        "kv_writes_per_step": 2.0,
        "event_writes_per_step": 2.0,
    }.items():
        fig.put("paced", f"v1_s100_{name}", value)
    fig.put("shards", "k1_cpu_us_per_message_all_nodes", 30.0)
    fig.put("shards", "k1_leader_node_cpu_us_per_message", 10.0)
    return fig


def test_the_frames_off_baseline_from_round_inputs() -> None:
    fig = _with_frames_off(_figures({100: 1.0}))
    offs = capacity.frames_off_plans(fig)
    assert offs is not None
    off = capacity.plan(offs[0])
    # the same gateway, assembler and telemetry cores as frames on: 500, 100, 25
    assert (off.cores["gateway"], off.cores["assembler"], off.cores["telemetry"]) == (500, 100, 25)
    # broker per chunk: 1.0 * (30 + 30) + (100 + 30 + 2 * 30) / 100 = 61.9 us
    # -> 5e6 * 61.9e-6 / 0.6 = 515.8 -> 516 cores -> 65 nodes of 8 -> 520 cores
    assert (off.nodes, off.cores["broker"]) == (65, 520)
    # a leader per chunk: 1.0 * (10 + 25) = 35 us -> 5e6 * 35e-6 / 0.5 = 350 streams
    assert off.streams == 350
    assert off.total == 500 + 100 + 25 + 520
    # frames on: 785 cores (test_the_plan_from_round_inputs) over 1,145 = 0.686
    text = capacity.render(fig)
    assert "| **total cores** | **785** | **1,145** |" in text
    assert "| frames on over frames off (target <= 0.5x) | 0.69x (not met) |" in text
    assert "frames off in the same run (1,145 cores) it is 0.69x" in text


def test_without_a_frames_off_pass_the_document_says_so() -> None:
    fig = _figures({100: 1.0})
    assert capacity.frames_off_plans(fig) is None
    assert "This run has no frames-off pass" in capacity.render(fig)


def test_the_frames_off_broker_takes_the_v1_consumers_cost_when_measured() -> None:
    fig = _with_frames_off(_figures({100: 1.0}))
    fig.put("shards", "consume_v1_cpu_us_per_message_all_nodes", 40.0)
    fig.put("shards", "consume_v1_max_node_cpu_us_per_message", 30.0)
    offs = capacity.frames_off_plans(fig)
    assert offs is not None
    off = capacity.plan(offs[0])
    # broker per chunk: 1.0 * (30 + 40) + (100 + 40 + 2 * 30) / 100 = 72 us
    # -> 5e6 * 72e-6 / 0.6 = 600 cores -> 75 nodes of 8 -> 600 cores
    assert (off.nodes, off.cores["broker"]) == (75, 600)
    # a leader per chunk: 1.0 * (10 + 30) = 40 us -> 5e6 * 40e-6 / 0.5 = 400 streams
    assert off.streams == 400
    # frames on keeps the frames stream's consumer (30 / 25): 785 cores as before
    assert capacity.plan(_capacity_inputs.paced_inputs(fig)).total == 785


def test_the_floors_scale_the_gateways_cores_by_their_same_run_ratio() -> None:
    fig = _figures({100: 1.0})
    sides = (
        ("gateway", 80.0, 1.0),
        ("coalesced", 24.0, 0.3),
        ("proxy", 40.0, 0.5),
        ("relay", 16.0, 0.2),
    )
    for name, us, ratio in sides:
        fig.put("floor", f"{name}_us_per_token", us)
        fig.put("floor", f"{name}_over_gateway", ratio)
    fig.put("floor", "sessions", 150.0)
    fig.put("floor", "rounds", 4.0)
    text = capacity.render(fig)
    # the model: 785 cores, 500 of them the gateway, so 285 for the rest
    # (test_the_plan_from_round_inputs); the proxy at 0.5x: 250 + 285 = 535 (0.72x of 742);
    # the relay at 0.2x: 100 + 285 = 385, above 371
    assert "| the gateway, as shipped | 80.0 | 1.00x | 500 | 785 | 1.06x |" in text
    assert "| a bare proxy (uvicorn + aiohttp) | 40.0 | 0.50x | 250 | 535 | 0.72x |" in text
    assert "| a TCP relay (uvloop protocols, parses nothing) | 16.0 | 0.20x | 100 | 385 |" in text
    assert "the model's total would be 385 cores, still above the issue's 371" in text
    # callers coalescing: 0.3 x 500 = 150 gateway cores, 435 in all
    assert "| the gateway, callers coalescing reads to 100 ms | 24.0 | 0.30x | 150 | 435 |" in text
    assert "coalesce its provider reads to 100 ms (ADR 0032; each later token up to 100 ms" in text
    assert "several per write) needs 435." in text


def test_without_the_floor_phase_the_document_says_so() -> None:
    text = capacity.render(_figures({100: 1.0}))
    assert "Not in these figures: run `make bench BENCH=floor`." in text


def test_the_floor_part_closes_with_the_models_total_and_the_gateway_at_the_proxys_cost() -> None:
    fig = _figures({100: 1.0})
    assert "no paced inputs" in capacity.floor_line(Figures("default"))
    fig.put("floor", "gateway_over_proxy", 1.25)
    # the model: 785 cores, 500 of them the gateway (test_the_plan_from_round_inputs); the
    # gateway at the proxy's CPU per token: 500 / 1.25 = 400 + 285 = 685
    line = capacity.floor_line(fig)
    assert "**785 cores** for 100,000 sessions at 50 tokens/s (500 gateway)" in line
    assert "with the gateway at the bare proxy's CPU per token: 685." in line


def test_the_floor_table_gives_each_runs_ratio_to_the_proxy_and_their_median() -> None:
    figures = {"sessions": 150.0, "rounds": 4.0, "runs": 3.0, "gateway_over_proxy": 1.1}
    for i, ratio in enumerate((1.2, 1.1, 0.9)):
        figures[f"gateway_over_proxy_{i}"] = ratio
    for name in bench_floor.SIDES:
        figures |= {f"{name}_us_per_token": 40.0, f"{name}_over_gateway": 1.0}
        figures |= {f"{name}_us_min": 30.0, f"{name}_us_max": 50.0}
    text = bench_floor.table(figures)
    assert "| side (150 sessions at 50 tokens/s, 3 runs of 4 rounds) |" in text
    assert "median of 3 runs: 1.20x, 1.10x, 0.90x; target <= 1.0x) | **1.10x** |" in text


def test_the_split_solves_a_cost_per_step_and_per_token_from_two_step_lengths() -> None:
    # A side paying 2,000 us a step and 30 us a token: 50 us a token at 100-token steps,
    # 35 at 400-token steps (by hand: 2000/100 + 30, 2000/400 + 30).
    step, token = bench_floor.split(50.0, 35.0, 100, 400)
    assert round(step, 6) == 2000.0
    assert round(token, 6) == 30.0


def test_the_floor_table_and_the_model_give_the_split_when_measured() -> None:
    figures = {
        "gateway_us_per_step": 1207.0,
        "gateway_marginal_us_per_token": 62.2,
        "proxy_us_per_step": 655.0,
        "proxy_marginal_us_per_token": 30.7,
        "gateway_marginal_over_proxy": 62.2 / 30.7,
        "long_tokens": 400.0,
    }
    rows = bench_floor.split_table(figures)
    assert "| gateway | 1,207 | 62.2 |" in rows
    assert "| proxy | 655 | 30.7 |" in rows
    assert "| gateway over the bare proxy, per token | | 2.03x |" in rows
    text = " ".join(capacity._split_lines(figures))
    assert "the gateway 1,207 us a step and 62.2 us a token" in text
    # Above the proxy at 100-token steps, by hand: 62.2 - 30.7 = 31.5 us per token,
    # (1,207 - 655) / 100 = 5.5 per step; 31.5 / 37.0 = 85 % per token.
    assert "31.5 us a token is per token and 5.5 per step (85% per token)" in text
    assert capacity._split_lines({}) == []
