"""docs/capacity.md: a capacity model computed from the suite's figures (results.json).

``python -m bench.capacity [results.json] [capacity.md]`` regenerates it without a new run.
Every assumption is a named constant below and printed in the document; every input names
the phase and scenario it was measured in (issue 27 part 4).

The model's inputs come from the ``paced`` phase (bench/bench_paced.py: the whole stack with
the shipped defaults, sessions at 50 tokens/s each) and the ``shards`` phase
(bench/bench_shards.py: a loopback three-node cluster at R3). The same arithmetic is also
done on the full-speed figures (50 callers, 200 fragments as fast as possible: the inputs the
model used before frames), as a second, stated row. A phase that did not run falls back to
stated constants, named in the document.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

from bench._capacity_inputs import (
    FRAMES_OFF,
    PACE_KEPT,
    Inputs,
    _ok,
    full_speed_inputs,
    paced_inputs,
    paced_load,
    stack_broker_inputs,
)
from bench._suite import REPO, Figures, load
from bench.bench_floor import COALESCE_MS
from bench.bench_floor import TOKENS as FLOOR_STEP_TOKENS

SESSIONS = 100_000
TOKENS_PER_S = 50.0
CHUNKS_PER_TOKEN = 1.0  # one streamed chunk per token (providers send one delta per token)
UTILISATION = 0.6  # plan cores to 60 % busy: headroom for bursts, GC, failover
LEADER_FRACTION = 0.5  # no stream's (or bucket's) leader above half a core: room for failover
REPLICAS = 3  # JetStream R3
NODE_CORES = 8  # cores per broker node
RETENTION_H = 24.0  # hours of replay the disk rows are sized for
PARTITION_HEADROOM = 4  # partitions per assembler process, so the fleet can grow 4x unpinned
TODAY_CORES = 742  # docs/capacity.md before issue 27 (run of 2026-12-02, full-speed inputs)
FLEETS = (1_000, 5_000, 100_000)
STEP_TOKENS = (100, 500, 1_000)  # step lengths for the step registry's rows
GIB = 1024**3


@dataclass
class Plan:
    """What :data:`SESSIONS` sessions at :data:`TOKENS_PER_S` need, from one set of inputs."""

    chunk_rate: float
    cores: dict[str, int]
    streams: int
    nodes: int
    leader_share: float  # of a core, per stream leader at ``streams``
    partitions: int
    messages_per_s: float
    steps_per_s: float
    kv_leader_share: float
    events_leader_share: float

    @property
    def total(self) -> int:
        return sum(self.cores.values())


def broker_per_chunk(x: Inputs) -> tuple[float, float]:
    """(every node's CPU per chunk at R3, a stream leader's), us.

    ``cluster``: the cluster's own figures per message, at the messages per chunk measured:
    a publish and one consumer's delivery and ack (the assembler's) per message, the
    telemetry consumer's one delivery per step, the registry's writes and the events per
    step; the leader carries the publish's leader share and the consumer's busiest node.
    ``stack``: the whole stack's one-server CPU per chunk times the cluster's ratios."""
    if x.broker == "stack":
        return x["nats_us"] * x["r3_over_r1"], x["nats_us"] * x["leader_over_r1"]
    per_msg = x["publish_us_per_message"] + x["consume_us_per_message"]
    per_step = (
        x["kv_us_per_step"]
        + x["consume_us_per_message"]  # telemetry's delivery
        + x["event_writes_per_step"] * x["publish_us_per_message"]
    )
    every = x["messages_per_chunk"] * per_msg + per_step / x["chunks_per_step"]
    leader = x["messages_per_chunk"] * (
        x["leader_us_per_message"] + x["consume_max_us_per_message"]
    )
    return every, leader


def plan(x: Inputs, sessions: int = SESSIONS) -> Plan:
    chunk_rate = sessions * TOKENS_PER_S * CHUNKS_PER_TOKEN

    def cores(us: float) -> int:
        return max(1, math.ceil(chunk_rate * us / 1e6 / UTILISATION))

    broker_us, leader_us = broker_per_chunk(x)
    streams = math.ceil(chunk_rate * leader_us / 1e6 / LEADER_FRACTION)
    broker = cores(broker_us)
    nodes = max(REPLICAS, math.ceil(broker / NODE_CORES))
    streams = max(streams, min(nodes, 1 << 16))  # every node leads at least one stream
    asm = cores(x["assembler_us"])
    partitions = 2 ** math.ceil(math.log2(max(streams, asm * PARTITION_HEADROOM)))
    steps = chunk_rate / x["chunks_per_step"]
    return Plan(
        chunk_rate=chunk_rate,
        cores={
            "gateway": cores(x["gateway_us"]),
            "assembler": asm,
            "telemetry": cores(x["telemetry_us"]),
            "broker": nodes * NODE_CORES,
        },
        streams=streams,
        nodes=nodes,
        leader_share=chunk_rate / streams * leader_us / 1e6,
        partitions=partitions,
        messages_per_s=chunk_rate * x["messages_per_chunk"],
        steps_per_s=steps,
        kv_leader_share=steps * x["kv_leader_us_per_step"] / 1e6,
        events_leader_share=steps * x["event_writes_per_step"] * x["leader_us_per_message"] / 1e6,
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:,.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds / 3600:,.1f} h"


def _inputs_table(rows: list[Inputs]) -> list[str]:
    labels = (
        ("gateway_us", "gateway CPU per chunk, us", "{:.1f}"),
        ("assembler_us", "assembler CPU per chunk (SQLite), us", "{:.1f}"),
        ("telemetry_us", "telemetry CPU per chunk, us", "{:.2f}"),
        ("nats_us", "nats-server CPU per chunk (one server, R1, whole stack), us", "{:.1f}"),
        ("messages_per_chunk", "broker messages per chunk", "{:.3f}"),
        (
            "stream_bytes",
            "stream bytes per chunk (`state.bytes`, what `max_bytes` counts)",
            "{:.1f}",
        ),
        ("disk_bytes", "bytes on disk per chunk with S2 (one replica)", "{:.1f}"),
        ("chunks_per_step", "chunks per step", "{:.0f}"),
        ("kv_writes_per_step", "step-registry KV writes per step", "{:.2f}"),
        ("event_writes_per_step", "events-stream writes per step", "{:.2f}"),
        ("r3_over_r1", "broker CPU at R3 (all nodes) over one server's, per message", "{:.2f}"),
        ("leader_over_r1", "stream leader node's CPU over one server's, per message", "{:.2f}"),
        ("leader_us_per_message", "stream leader node CPU per message, us", "{:.1f}"),
        ("kv_leader_us_per_step", "step-registry bucket leader CPU per step (R3), us", "{:.1f}"),
        ("kv_us_per_step", "step-registry CPU per step (R3, all nodes), us", "{:.1f}"),
        ("publish_us_per_message", "publish CPU per message (R3, all nodes), us", "{:.1f}"),
        (
            "consume_us_per_message",
            "a consumer's delivery + ack per message (R3, all nodes), us",
            "{:.1f}",
        ),
        ("consume_max_us_per_message", "the same, its busiest node, us", "{:.1f}"),
    )
    out = [
        "| input | " + " | ".join(r.label for r in rows) + " | measured in |",
        "| --- |" + " ---: |" * len(rows) + " --- |",
    ]
    for key, label, fmt in labels:
        sources = []
        for r in rows:
            if r.source[key] not in sources:
                sources.append(r.source[key])
        cells = " | ".join(fmt.format(r[key]) for r in rows)
        out.append(f"| {label} | {cells} | {'; '.join(sources)} |")
    return out


def _paced_range(fig: Figures) -> list[str]:
    """Every paced load side by side: how the per-chunk figures move with concurrency."""
    loads = sorted(
        int(v)
        for k, v in fig.values.get("paced", {}).items()
        if k.startswith("s") and k.endswith("_sessions")
    )
    if not loads:
        return ["The paced phase did not run: the model's inputs are the stated constants."]
    g = fig.get
    out = [
        "| paced load | " + " | ".join(f"{n} sessions" for n in loads) + " |",
        "| --- |" + " ---: |" * len(loads),
    ]
    rows = (
        ("pace kept (provider's step time / measured step time)", "pace", "{:.3f}"),
        ("chunks/s", "chunks_per_s", "{:,.0f}"),
        ("broker messages per chunk", "messages_per_chunk", "{:.3f}"),
        ("stream bytes per chunk", "stream_bytes_per_chunk", "{:.1f}"),
        ("gateway us/chunk", "cpu_us_per_chunk_gateway", "{:.1f}"),
        ("assembler us/chunk", "cpu_us_per_chunk_assembler", "{:.1f}"),
        ("telemetry us/chunk", "cpu_us_per_chunk_telemetry", "{:.1f}"),
        ("nats-server us/chunk", "cpu_us_per_chunk_nats", "{:.1f}"),
        ("gateway: share of a core busy", "busy_gateway", "{:.2f}"),
        ("assembler: share of a core busy", "busy_assembler", "{:.2f}"),
        ("nats-server: share of a core busy", "busy_nats", "{:.2f}"),
    )
    for label, key, fmt in rows:
        out.append(
            f"| {label} | "
            + " | ".join(fmt.format(g("paced", f"s{n}_{key}")) for n in loads)
            + " |"
        )
    totals = [plan(paced_inputs(fig, n)).total for n in loads]
    out.append(
        "| the model's total cores with this load's inputs | "
        + " | ".join(f"{t:,}" for t in totals)
        + " |"
    )
    return out


def _retention(fig: Figures, x: Inputs) -> list[str]:
    g = fig.get
    bases = [("paced run (scripted provider's text)", x["stream_bytes"], x["disk_bytes"])]
    rec_stream = g("shards", "recorded_stream_bytes_per_chunk")
    rec_disk = g("shards", "recorded_disk_bytes_per_chunk")
    if _ok(rec_stream) and _ok(rec_disk):
        bases.append(("recorded provider streams in frames (phase shards)", rec_stream, rec_disk))
    out = [
        "| sessions at 50 tokens/s | bytes per chunk from | stream bytes/s | replay per GiB of "
        "budget (`max_bytes`) | hours per GiB | budget for 24 h | replay per GiB of disk with "
        "S2, per replica | disk for 24 h, R3 |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for sessions in FLEETS:
        rate = sessions * TOKENS_PER_S * CHUNKS_PER_TOKEN
        for label, stream_b, disk_b in bases:
            per_gib = GIB / (rate * stream_b)
            disk_gib = GIB / (rate * disk_b)
            out.append(
                f"| {sessions:,} | {label} | {rate * stream_b / 1e6:,.2f} MB/s "
                f"| {_duration(per_gib)} | {per_gib / 3600:.4g} "
                f"| {rate * stream_b * 86400 / GIB:,.0f} GiB | {_duration(disk_gib)} "
                f"| {rate * disk_b * 86400 * REPLICAS / 1e12:,.2f} TB |"
            )
    return out


def registry_shards_for(kv_leader_share: float, events_leader_share: float) -> int:
    """The R (registry buckets, and as many events streams) that keeps each leader within
    :data:`LEADER_FRACTION` of a core."""
    return max(1, math.ceil(max(kv_leader_share, events_leader_share) / LEADER_FRACTION))


def _registry(x: Inputs) -> list[str]:
    rate = SESSIONS * TOKENS_PER_S * CHUNKS_PER_TOKEN
    out = [
        "| step length | steps/s | KV writes/s | one bucket's leader, share of a core "
        "| events writes/s | one events stream's leader, share of a core "
        f"| R for <= {LEADER_FRACTION:g} core per leader |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lengths = [x["chunks_per_step"], *(float(t) for t in STEP_TOKENS)]
    for length in sorted(set(lengths)):
        steps = rate / length
        kv = steps * x["kv_leader_us_per_step"] / 1e6
        ev = steps * x["event_writes_per_step"] * x["leader_us_per_message"] / 1e6
        tag = " (measured)" if length == x["chunks_per_step"] else ""
        out.append(
            f"| {length:,.0f} chunks ({length / TOKENS_PER_S:.1f} s){tag} | {steps:,.0f} "
            f"| {steps * x['kv_writes_per_step']:,.0f} | {kv:.2f} "
            f"| {steps * x['event_writes_per_step']:,.0f} | {ev:.2f} "
            f"| {registry_shards_for(kv, ev)} |"
        )
    return out


def _registry_advice(p: Plan) -> str:
    r = registry_shards_for(p.kv_leader_share, p.events_leader_share)
    measured = (
        f"At the measured step length ({p.steps_per_s:,.0f} steps/s) one bucket's leader "
        f"carries {p.kv_leader_share:.2f} of a core and one events stream's "
        f"{p.events_leader_share:.2f}: "
    )
    if r == 1:
        return measured + "one of each suffices."
    return (
        measured + f"set `TOKENWIRE_REGISTRY_SHARDS={r}` before the first provisioning "
        '(docs/operations.md, "The step registry\'s shards"; R never changes on a deployment), '
        "or steps be longer."
    )


def _plan_table(rows: list[tuple[Inputs, Plan]]) -> list[str]:
    out = [
        "| need | " + " | ".join(x.label for x, _ in rows) + " |",
        "| --- |" + " ---: |" * len(rows),
    ]

    def row(label: str, cells: list[str]) -> None:
        out.append(f"| {label} | " + " | ".join(cells) + " |")

    row("chunks/s", [f"{p.chunk_rate:,.0f}" for _, p in rows])
    row("broker messages/s", [f"{p.messages_per_s:,.0f}" for _, p in rows])
    row("gateway processes (one per core)", [f"{p.cores['gateway']:,}" for _, p in rows])
    row("assembler processes (one per core)", [f"{p.cores['assembler']:,}" for _, p in rows])
    row("telemetry consumer processes", [f"{p.cores['telemetry']:,}" for _, p in rows])
    row(
        f"chunk streams (shards; each leader <= {LEADER_FRACTION:g} core)",
        [f"{p.streams:,}" for _, p in rows],
    )
    row("broker CPU per chunk, all nodes, us", [f"{broker_per_chunk(x)[0]:.1f}" for x, _ in rows])
    row("a stream leader's share of a core", [f"{p.leader_share:.2f}" for _, p in rows])
    row(f"broker nodes of {NODE_CORES} cores (R{REPLICAS})", [f"{p.nodes:,}" for _, p in rows])
    row("broker cores (nodes x cores)", [f"{p.cores['broker']:,}" for _, p in rows])
    row("partitions", [f"{p.partitions:,}" for _, p in rows])
    row(
        "step-registry bucket leader, share of a core (one bucket)",
        [f"{p.kv_leader_share:.2f}" for _, p in rows],
    )
    row(
        f"step-registry buckets (`TOKENWIRE_REGISTRY_SHARDS`; each leader <= {LEADER_FRACTION:g}"
        " core)",
        [f"{math.ceil(p.kv_leader_share / LEADER_FRACTION)}" for _, p in rows],
    )
    row(
        "**total cores** (gateway + assembler + telemetry + broker)",
        [f"**{p.total:,}**" for _, p in rows],
    )
    row(
        f"against today's {TODAY_CORES} (target <= {TODAY_CORES // 2})",
        [
            f"{p.total / TODAY_CORES:.2f}x ({'met' if p.total <= TODAY_CORES / 2 else 'not met'})"
            for _, p in rows
        ],
    )
    return out


def frames_off_plans(fig: Figures) -> tuple[Inputs, Inputs] | None:
    """The model's and the full-speed inputs with frames off, same run (the paced phase's
    frames-off pass, at the model's load), or None when the run has no such pass."""
    n = paced_load(fig)
    if n is None or not _ok(fig.get("paced", f"{FRAMES_OFF}s{n}_cpu_us_per_chunk_gateway")):
        return None
    off = paced_inputs(fig, n, FRAMES_OFF)
    return off, full_speed_inputs(fig, off, FRAMES_OFF)


def _against_frames_off(rows: list[tuple[str, Plan, Plan]]) -> list[str]:
    """Frames on against frames off, the same run, method by method: the target's ratio."""
    out = [
        "| method | " + " | ".join(f"{m}: frames on | {m}: frames off" for m, _, _ in rows) + " |",
        "| --- |" + " ---: | ---: |" * len(rows),
    ]
    for part in ("gateway", "assembler", "telemetry", "broker"):
        cells = " | ".join(f"{on.cores[part]:,} | {off.cores[part]:,}" for _, on, off in rows)
        out.append(f"| {part} cores | {cells} |")
    cells = " | ".join(f"**{on.total:,}** | **{off.total:,}**" for _, on, off in rows)
    out.append(f"| **total cores** | {cells} |")
    ratios = []
    for _, on, off in rows:
        met = "met" if on.total <= off.total / 2 else "not met"
        ratios += [f"{on.total / off.total:.2f}x ({met})", ""]
    out.append("| frames on over frames off (target <= 0.5x) | " + " | ".join(ratios) + " |")
    return out


def _frames_off_section(fig: Figures, paced: Plan, full: Plan) -> list[str]:
    head = ["### Against the wire before frames, measured in the same run", ""]
    offs = frames_off_plans(fig)
    if offs is None:
        return [
            *head,
            "This run has no frames-off pass (phase paced, `v1_` figures): the "
            "only baseline is the stated 742.",
        ]
    off, off_full = plan(offs[0]), plan(offs[1])
    return [
        *head,
        "The paced phase runs the same loads again on a fresh stack with frames off "
        "(`TOKENWIRE_FRAMES=false`: one v1 message per chunk, the wire the 742 was computed "
        "for), and the same arithmetic gives the baseline: the issue's target (at most half) "
        "as a same-run ratio, for each method. The frames-off broker takes the cluster's "
        "publish, leader and consumer cost per v1 message (phase shards, K = 1, v1; a run "
        "without the v1 consumer's figure takes the frames stream's); the full-speed "
        "columns' broker scales the stack's one server by the frames' R3-over-R1 ratio for "
        "both wires (the only wire measured at R1).",
        "",
        *_against_frames_off([("paced model", paced, off), ("full speed", full, off_full)]),
    ]


_FLOOR_SIDES = (
    ("gateway", "the gateway, as shipped"),
    ("coalesced", f"the gateway, callers coalescing reads to {COALESCE_MS} ms"),
    ("proxy", "a bare proxy (uvicorn + aiohttp)"),
    ("relay", "a TCP relay (uvloop protocols, parses nothing)"),
)


def floor_line(fig: Figures) -> str:
    """The model's total with these figures, and with the gateway's cores scaled by its ratio
    to the bare proxy (phase ``floor``): what ``make bench BENCH=floor`` closes with."""
    floor = fig.values.get("floor", {})
    if "paced" not in fig.values or "gateway_over_proxy" not in floor:
        return "capacity model: no paced inputs in these figures (run `make bench`)."
    p = plan(paced_inputs(fig))
    rest = p.total - p.cores["gateway"]
    at_proxy = rest + math.ceil(p.cores["gateway"] / floor["gateway_over_proxy"])
    return (
        f"capacity model (docs/capacity.md, the paced phase's inputs): **{p.total:,} cores** "
        f"for {SESSIONS:,} sessions at {TOKENS_PER_S:g} tokens/s ({p.cores['gateway']:,} "
        f"gateway); with the gateway at the bare proxy's CPU per token: {at_proxy:,}."
    )


def _floor_section(fig: Figures, p: Plan) -> list[str]:
    """The model's total with the gateway's cores scaled by each floor's same-run ratio."""
    head = ["## The gateway against relaying floors", ""]
    floor = fig.values.get("floor", {})
    if "relay_over_gateway" not in floor:
        return [*head, "Not in these figures: run `make bench BENCH=floor`."]
    rest = p.total - p.cores["gateway"]
    rows = [
        "| side | CPU us per token | ratio to the gateway | gateway cores | total cores "
        f"| against {TODAY_CORES} |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]

    def total(name: str) -> int:
        return rest + math.ceil(p.cores["gateway"] * floor[f"{name}_over_gateway"])

    for name, label in _FLOOR_SIDES:
        if f"{name}_over_gateway" not in floor:
            continue  # a run before that side was measured
        rows.append(
            f"| {label} | {floor[f'{name}_us_per_token']:.1f} | "
            f"{floor[f'{name}_over_gateway']:.2f}x | {total(name) - rest:,} | "
            f"{total(name):,} | {total(name) / TODAY_CORES:.2f}x |"
        )

    relay_total = total("relay")
    verdict = "still above" if relay_total > TODAY_CORES // 2 else "at or below"
    coalescing = (
        f" A fleet whose callers let the gateway coalesce its provider reads to {COALESCE_MS} "
        f"ms (ADR 0032; each later token up to {COALESCE_MS} ms later, several per write) needs "
        f"{total('coalesced'):,}."
        if "coalesced_over_gateway" in floor
        else ""
    )
    return [
        *head,
        "How much of the gateway's CPU per token is its own work, and how much any Python "
        "process pays that passes each token on as it arrives (phase `floor`, "
        "bench/bench_floor.py): the gateway, a bare forwarding proxy and a TCP relay, each in "
        "front of the same paced scripted provider, ran the same load in alternating rounds "
        f"({floor['sessions']:.0f} sessions at {TOKENS_PER_S:g} tokens/s, "
        f"{floor['rounds']:.0f} rounds, medians). The model's gateway cores are scaled by each "
        "side's same-run ratio; the other processes' cores are the model's "
        f"({rest:,}).",
        "",
        *rows,
        "",
        f"With a gateway that did nothing but relay bytes, the model's total would be "
        f"{relay_total:,} cores, {verdict} the issue's {TODAY_CORES // 2}: the relay is one "
        "wake-up, one read and one write per token, which a gateway that passes each token "
        "on at once (never delaying the caller's stream) cannot avoid." + coalescing,
        *_split_lines(floor),
    ]


def _split_lines(floor: dict[str, float]) -> list[str]:
    """The gateway's and the proxy's CPU as a cost per step and a cost per token, when the
    floor run measured them (bench_floor's one round of long steps), and how the gateway's
    excess over the proxy divides between the two at the floor's step length."""
    if "gateway_us_per_step" not in floor:
        return []
    per_token = floor["gateway_marginal_us_per_token"] - floor["proxy_marginal_us_per_token"]
    per_step = (floor["gateway_us_per_step"] - floor["proxy_us_per_step"]) / FLOOR_STEP_TOKENS
    share = per_token / (per_token + per_step) if per_token + per_step > 0 else float("nan")
    return [
        "",
        f"Split into a cost per step and a cost per token (the same run, steps of "
        f"{FLOOR_STEP_TOKENS} and of {floor['long_tokens']:.0f} tokens): the gateway "
        f"{floor['gateway_us_per_step']:,.0f} us a step and "
        f"{floor['gateway_marginal_us_per_token']:.1f} us a token, the bare proxy "
        f"{floor['proxy_us_per_step']:,.0f} us a step and "
        f"{floor['proxy_marginal_us_per_token']:.1f} us a token (per token the gateway is "
        f"{floor['gateway_marginal_over_proxy']:.2f}x the proxy). Of what the gateway pays "
        f"above the proxy at {FLOOR_STEP_TOKENS}-token steps, {per_token:.1f} us a token is "
        f"per token and {per_step:.1f} per step ({share:.0%} per token).",
    ]


def _when(fig: Figures) -> str:
    paced = fig.notes.get("paced", "")
    g = fig.get
    shards = ""
    if _ok(g("shards", "load_avg_1m_start")):
        shards = (
            f"; phase shards: 1-minute load average {g('shards', 'load_avg_1m_start'):.2f} "
            f"at its start, {g('shards', 'load_avg_1m_end'):.2f} at its end"
        )
    return (f"phase paced: {paced}" if paced else "phase paced: not in this run") + shards


def _headline(fig: Figures, plans: list[tuple[Inputs, Plan]]) -> str:
    (paced, p), full = plans[0], plans[2][1]
    n = paced_load(fig)
    if n is None:
        return (
            "**The paced phase is not in these figures**: the model's column is made of "
            "the stated constants (`FALLBACK` in bench/capacity.py) and says nothing; run "
            "`make bench BENCH=paced` (and `shards`)."
        )
    met = p.total <= TODAY_CORES / 2
    offs = frames_off_plans(fig)
    same_run = ""
    if offs is not None:
        off = plan(offs[0]).total
        same_run = (
            f" Against the same model with frames off in the same run ({off:,} cores) "
            f"it is {p.total / off:.2f}x (below)."
        )
    busy = fig.get("paced", f"s{n}_busy_gateway")
    per_core = 1e6 * UTILISATION / (paced["gateway_us"] * TOKENS_PER_S * CHUNKS_PER_TOKEN)
    return (
        f"**{p.total:,} cores with the inputs measured at that pace** ({p.cores['gateway']:,} "
        f"gateway, {p.cores['assembler']:,} assembler, {p.cores['telemetry']:,} telemetry, "
        f"{p.cores['broker']:,} broker: {p.nodes:,} nodes of {NODE_CORES} cores at "
        f"R{REPLICAS}, {p.streams:,} chunk streams), against {TODAY_CORES} before frames: "
        f"the target (at most {TODAY_CORES // 2}) is "
        + ("met." if met else "**not met**.")
        + same_run
        + f" The gateway is the bound: {p.cores['gateway']:,} cores. At {n} sessions one "
        f"gateway process was {busy:.0%} busy ({paced['gateway_us']:.0f} us per chunk), so a "
        f"core planned at {UTILISATION:.0%} serves about {per_core:,.0f} sessions at "
        f"{TOKENS_PER_S:g} tokens/s. At that pace every token is its own provider read and "
        "its own write to the caller, and the process pays a wake-up, two system calls and "
        "the interpreted per-read work (SSE parse, normalise, meter, frame, forward) for each; "
        'the profile (docs/benchmarks.md, "The linger default moved to 200 ms") finds most '
        "of it in the interpreter, spread over ~40 functions; "
        "at full speed one read carries many tokens, which is why the method behind today's "
        f"{TODAY_CORES} (CPU per chunk at full speed) gives {full.total:,} with the same "
        "code. The broker is no longer the bound: frames cut its messages to "
        f"{paced['messages_per_chunk']:.3f} per chunk. The columns: the model (the gateway, "
        "assembler and telemetry as measured on the paced stack; the broker from the "
        "cluster's CPU per message, a broker as busy as a planned node); the same with the "
        "broker as the paced stack's lightly loaded single server measured it (an upper "
        "bound: there every message is its own wake-up); and the full-speed figures."
    )


def render(fig: Figures, preliminary: bool = True) -> str:
    paced = paced_inputs(fig)
    stack = stack_broker_inputs(fig)
    full = full_speed_inputs(fig, paced)
    plans = [(paced, plan(paced)), (stack, plan(stack)), (full, plan(full))]
    mark = (
        "**Preliminary, measured under load**: regenerate after the final `make bench`.\n\n"
        if preliminary
        else ""
    )
    n = paced_load(fig)
    p = plans[0][1]
    lines = [
        "# Capacity model",
        "",
        "Generated by `python -m bench.capacity` from `docs/bench-results.json` (profile "
        f"`{fig.profile}`); the inputs come from the phases `paced` (bench/bench_paced.py) and "
        f"`shards` (bench/bench_shards.py) of `make bench` ({_when(fig)}). {mark}",
        f"## {SESSIONS:,} concurrent sessions at {TOKENS_PER_S:g} tokens/s",
        "",
        _headline(fig, plans),
        "",
        *_plan_table(plans),
        "",
        *_frames_off_section(fig, p, plans[2][1]),
        "",
        *_floor_section(fig, p),
        "",
        "## Inputs",
        "",
        f"The model's column is the paced load with the most sessions ({n}) whose steps kept "
        f"the provider's pace (at least {PACE_KEPT:.0%}); CPU is `/proc` user + system of each "
        "process from the first request to the store having committed every chunk, over the "
        "chunks committed (gross: the processes' idle cost included).",
        "",
        *_inputs_table([paced, full, *(frames_off_plans(fig) or ())]),
        "",
        "Every paced load of the run (the per-chunk CPU falls as a process gets busier: more "
        "ready sockets per wake-up; a process planned at "
        f"{UTILISATION:.0%} busy is at least as busy as the model's column):",
        "",
        *_paced_range(fig),
        "",
        "## Assumptions (not measured)",
        "",
        f"- {CHUNKS_PER_TOKEN:g} chunk per token, every session streaming all the time; cores "
        f"planned at {UTILISATION:.0%} busy; CPU per chunk adds linearly over processes on "
        "separate cores (not measurable on 2 cores, where a second process only competes);",
        f"- steps as measured ({paced['chunks_per_step']:.0f} chunks: 100 text fragments and "
        "the step's role, finish and usage chunks, 2 s at 50 tokens/s): every per-step cost "
        "(the claim, the first chunk alone, the finish, the events) is in the per-chunk "
        "figures at that length; longer steps cost less per chunk;",
        "- the broker at R3, the model's column: per message, a publish (every node) and one "
        "consumer's delivery and ack (the assembler's; every node) as measured on the cluster "
        "flat out, at the paced messages per chunk; per step, the registry's writes (measured "
        "on the cluster), the telemetry consumer's delivery (a consumer's cost per message) "
        "and the events writes (a publish's cost per message each); a stream's leader carries "
        "the publish's leader node and the consumer's busiest node, for all of a stream's "
        "consumers;",
        "- the broker's upper bound (the second column): the paced stack's one nats-server's "
        "CPU per chunk (publishes, stores, deliveries and acks, registry and events writes, at "
        "a few hundred messages/s, each its own wake-up) times the cluster's CPU per message "
        "over one server's for the same frames load (phase shards); the full-speed column "
        "the same with the full-speed figures, as the model before frames did;",
        f"- chunk streams: as many as keep each leader at or below {LEADER_FRACTION:g} of a "
        "core (a stream is one raft group, its leader's work runs on one node; half a core "
        "leaves room for a failed node's leaders), and at least one per node; R"
        f"{REPLICAS}, nodes of {NODE_CORES} cores, the broker's cores planned at "
        f"{UTILISATION:.0%} like the others;",
        f"- partitions: {PARTITION_HEADROOM} per assembler process, a power of two, at least "
        "one per stream;",
        "- not counted: the provider and the callers (the scripted provider and the load "
        "generator are measured in the phase's table only), PostgreSQL (the assembler's "
        "figure is SQLite's), the network between hosts.",
        "",
        "What the 2-core machine cannot show: three nats-servers, the client and the other "
        "helpers' work share two cores, so the cluster's acked rates are the machine's, not "
        "a stream's or a node's; what carries over is CPU per message on each node, and the "
        "per-stream ceiling is that leader's CPU per message on a core of its own "
        f"(~{1e6 / paced['leader_us_per_message']:,.0f} messages/s, "
        f"~{1e6 / paced['leader_us_per_message'] / paced['messages_per_chunk']:,.0f} chunks/s "
        "at the paced messages per chunk). Scale-out over nodes is multiplied, not measured.",
        "",
        "## The step registry and the events",
        "",
        "Both take writes per step, not per chunk, and both are sharded by one setting, "
        "`TOKENWIRE_REGISTRY_SHARDS` (R): R KV buckets and R events streams, each a raft group "
        "of its own, a session's keys and its events in the one its hash names. "
        f"{paced['kv_writes_per_step']:.0f} registry writes per step (the pointer's "
        "compare-and-set and the claim's create), "
        f"{paced['event_writes_per_step']:.0f} events writes per step (persisted, started). At "
        f"{SESSIONS:,} sessions x {TOKENS_PER_S:g} tokens/s, with R = 1 (an events leader's "
        "cost per write taken as a chunk stream leader's per message):",
        "",
        *_registry(paced),
        "",
        _registry_advice(p),
        "",
        "## Retention: hours of replay per GiB",
        "",
        "`max_bytes` (`TOKENWIRE_RETENTION_BYTES`, split over the shards) counts messages "
        "before compression (ADR 0023): the budget's reach is the stream bytes per chunk. The "
        "volumes hold the S2-compressed blocks: the disk columns. Two measured bases: the "
        "paced run's chunks (the scripted provider's short, repetitive text) and the recorded "
        "provider streams framed as the gateway frames them (real text, tool calls, usage).",
        "",
        *_retention(fig, paced),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    src = Path(argv[0]) if argv else REPO / "docs" / "bench-results.json"
    dst = Path(argv[1]) if len(argv) > 1 else REPO / "docs" / "capacity.md"
    fig = load(src)
    if fig is None:
        print(f"no figures at {src}: run make bench first", file=sys.stderr)
        return 1
    dst.write_text(render(fig))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
