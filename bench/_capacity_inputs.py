"""The capacity model's inputs (bench/capacity.py): per-chunk figures from the paced phase,
the shards phase or the full-speed run, each with where it was measured, or a stated constant
when a phase did not run."""

from __future__ import annotations

import math
from dataclasses import dataclass

from bench._suite import Figures

PACE_KEPT = 0.95  # a paced load counts when its steps took at most 1/0.95 of the provider's pace
FRAMES_OFF = "v1_"  # the paced phase's frames-off pass (bench_paced.FRAMES_OFF_PREFIX)
FALLBACK = {  # stated constants for inputs a run did not measure
    "gateway_us": 50.0,
    "assembler_us": 50.0,
    "telemetry_us": 5.0,
    "nats_us": 10.0,
    "messages_per_chunk": 1.0,
    "stream_bytes": 212.0,
    "disk_bytes": 75.0,
    "r3_over_r1": 3.0,
    "leader_over_r1": 1.3,
    "kv_leader_us_per_step": 50.0,
    "kv_writes_per_step": 2.0,
    "event_writes_per_step": 2.0,
    "chunks_per_step": 104.0,
    "leader_us_per_message": 25.0,
    "publish_us_per_message": 45.0,
    "consume_us_per_message": 40.0,
    "consume_max_us_per_message": 20.0,
    "kv_us_per_step": 100.0,
}


def _ok(value: float) -> bool:
    return not math.isnan(value) and value > 0


@dataclass
class Inputs:
    """One set of per-chunk inputs and where each came from."""

    label: str
    values: dict[str, float]
    source: dict[str, str]
    broker: str = "cluster"  # "cluster": per message on the R3 cluster; "stack": R1 stack x ratio

    def __getitem__(self, key: str) -> float:
        return self.values[key]


def paced_load(fig: Figures, prefix: str = "") -> int | None:
    """The paced load the model takes: the most sessions whose steps kept the provider's
    pace (:data:`PACE_KEPT`); else the fewest sessions measured; None if none ran.
    ``prefix``: the frames-off pass's figures (:data:`FRAMES_OFF`)."""
    loads = sorted(
        int(v)
        for k, v in fig.values.get("paced", {}).items()
        if k.startswith(f"{prefix}s") and k.endswith("_sessions")
    )
    if not loads:
        return None
    kept = [n for n in loads if fig.get("paced", f"{prefix}s{n}_pace", 0.0) >= PACE_KEPT]
    return max(kept) if kept else loads[0]


def _take(inputs: Inputs, key: str, value: float, source: str) -> None:
    if _ok(value):
        inputs.values[key], inputs.source[key] = value, source
    else:
        inputs.values[key] = FALLBACK[key]
        inputs.source[key] = "not measured in this run: stated constant"


def _broker(fig: Figures, x: Inputs, frames: bool = True) -> None:
    """The cluster figures (phase ``shards``) the rows share; ``frames`` false: a publish,
    a leader's and a consumer's cost per message as the cluster measured one v1 message per
    chunk (the R3-over-R1 ratios stay the frames', the only wire measured at R1)."""
    g = fig.get
    cluster = "phase shards: loopback 3-node cluster, R3, S2, recorded streams in frames"
    r3 = g("shards", "k1f_cpu_us_per_message_all_nodes")
    r1 = g("shards", "r1f_cpu_us_per_message_all_nodes")
    leader = g("shards", "k1f_leader_node_cpu_us_per_message")
    _take(
        x,
        "r3_over_r1",
        r3 / r1 if _ok(r1) else math.nan,
        f"{cluster}: all nodes {r3:.1f} us/message over one server's {r1:.1f}",
    )
    _take(
        x,
        "leader_over_r1",
        leader / r1 if _ok(r1) else math.nan,
        f"{cluster}: leader node {leader:.1f} us/message over one server's {r1:.1f}",
    )
    layout = "k1f" if frames else "k1"
    if not frames:
        cluster = cluster.replace("in frames", "as one v1 message per chunk")
    leader = g("shards", f"{layout}_leader_node_cpu_us_per_message")
    _take(x, "leader_us_per_message", leader, f"{cluster}, K = 1, the leader node")
    _take(
        x,
        "kv_leader_us_per_step",
        g("shards", "kv_leader_node_cpu_us_per_step"),
        "phase shards: StepRegistry assignments on the R3 bucket, its leader node",
    )
    _take(
        x,
        "kv_us_per_step",
        g("shards", "kv_cpu_us_per_step_all_nodes"),
        "phase shards: StepRegistry assignments on the R3 bucket, all nodes",
    )
    _take(
        x,
        "publish_us_per_message",
        g("shards", f"{layout}_cpu_us_per_message_all_nodes"),
        f"{cluster}, K = 1, all nodes",
    )
    consume, wire = "consume", "frames"
    if not frames and _ok(g("shards", "consume_v1_cpu_us_per_message_all_nodes")):
        consume, wire = "consume_v1", "v1"
    _take(
        x,
        "consume_us_per_message",
        g("shards", f"{consume}_cpu_us_per_message_all_nodes"),
        f"phase shards: one durable pull consumer reading and acking the K = 1 {wire} "
        "stream, all nodes",
    )
    _take(
        x,
        "consume_max_us_per_message",
        g("shards", f"{consume}_max_node_cpu_us_per_message"),
        f"phase shards: the same consumer on the {wire} stream, its busiest node",
    )


def paced_inputs(fig: Figures, load: int | None = None, prefix: str = "") -> Inputs:
    """The model's inputs: the paced phase at ``load`` sessions (:func:`paced_load`);
    ``prefix`` :data:`FRAMES_OFF`: the same loads with frames off, same run."""
    n = load or paced_load(fig, prefix)
    off = prefix == FRAMES_OFF
    x = Inputs(
        "paced, frames off (the wire before frames), same run"
        if off
        else "paced, broker per message on the R3 cluster (the model)",
        {},
        {},
    )

    def p(name: str) -> float:
        return fig.get("paced", f"{prefix}s{n}_{name}") if n else math.nan

    defaults = "frames off, otherwise shipped defaults" if off else "shipped defaults"
    where = f"phase paced, {n} sessions at 50 tokens/s, {defaults}" if n else ""
    for proc in ("gateway", "assembler", "telemetry", "nats"):
        _take(x, f"{proc}_us", p(f"cpu_us_per_chunk_{proc}"), where)
    _take(x, "messages_per_chunk", p("messages_per_chunk"), where)
    _take(x, "stream_bytes", p("stream_bytes_per_chunk"), where)
    _take(
        x,
        "disk_bytes",
        fig.get("paced", f"{prefix}disk_bytes_per_chunk"),
        "phase paced: the chunk stream's files after the stack stopped, every paced load",
    )
    _take(x, "chunks_per_step", p("chunks_per_step"), where)
    _take(x, "kv_writes_per_step", p("kv_writes_per_step"), where)
    _take(x, "event_writes_per_step", p("event_writes_per_step"), where)
    _broker(fig, x, frames=not off)
    return x


def stack_broker_inputs(fig: Figures) -> Inputs:
    """The paced inputs with the broker as the paced stack's one server measured it."""
    x = paced_inputs(fig)
    x.label, x.broker = "paced, broker as on the paced stack (R1 x R3/R1)", "stack"
    return x


def full_speed_inputs(fig: Figures, paced: Inputs, prefix: str = "") -> Inputs:
    """The same arithmetic on full-speed figures (the inputs before frames used); ``prefix``
    :data:`FRAMES_OFF`: the frames-off pass's."""
    label = "full speed, 50 callers x 200 fragments (the method before frames)"
    x = Inputs(f"{label}, frames off" if prefix else label, {}, {}, "stack")
    g = fig.get
    full = f"{prefix}full"
    in_paced = _ok(g("paced", f"{full}_cpu_us_per_chunk_gateway"))
    where = (
        "phase paced: a second stack, 50 callers, 4 requests of 200 fragments at full "
        "speed (CPU until the callers' last event: the store's catch-up after it is not in "
        "it, as in the stack table)"
        if in_paced
        else "phase stack: full stack, 50 callers at full speed"
    )
    for proc in ("gateway", "assembler", "telemetry", "nats"):
        value = (
            g("paced", f"{full}_cpu_us_per_chunk_{proc}")
            if in_paced
            else g("stack", f"{prefix or 'full_'}cmany_cpu_ms_per_1k_{proc}")
        )
        _take(x, f"{proc}_us", value, where)
    _take(x, "messages_per_chunk", g("paced", f"{full}_messages_per_chunk"), where)
    _take(x, "stream_bytes", g("paced", f"{full}_stream_bytes_per_chunk"), where)
    for key in ("disk_bytes", "chunks_per_step", "kv_writes_per_step", "event_writes_per_step"):
        x.values[key], x.source[key] = paced.values[key], paced.source[key]
    x.values["chunks_per_step"] = 200.0  # the full-speed requests' steps
    _broker(fig, x, frames=not prefix)
    return x
