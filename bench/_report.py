"""docs/benchmarks.md's generated section and the PNG plots, from the run's figures."""

from __future__ import annotations

import math
from pathlib import Path

from bench._suite import Figures

BEGIN = "<!-- BEGIN GENERATED: make bench -->"
END = "<!-- END GENERATED: make bench -->"


def _f(x: float, fmt: str = ",.0f") -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, fmt)


def _ratio(a: float, b: float) -> str:
    if math.isnan(a) or math.isnan(b) or b == 0:
        return "—"
    return f"{a / b:.2f}x"


def stack_table(fig: Figures) -> str:
    s, p, lim = "stack", "peer", "limits"
    g = fig.get
    rows = [
        "| scenario | direct | tokenwire, full stack (every chunk durable) | tokenwire, no "
        "assembler/telemetry | tokenwire, aiohttp provider client | LiteLLM proxy "
        "(forwarding only) | bare proxy (limit) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    labels = (
        ("lone", "1 caller"),
        ("hot", "50 paced callers"),
        ("ttft", "1 caller, provider's first token after 50 ms"),
    )
    for tag, label in labels:
        for q in (50, 99):
            rows.append(
                f"| added first byte, {label}, p{q} ms | {_f(g(s, f'full_{tag}_direct_p{q}_ms'), '.2f')} "
                f"(absolute) | {_f(g(s, f'full_{tag}_added_p{q}_ms'), '+.2f')} "
                f"| {_f(g(s, f'bare_{tag}_added_p{q}_ms'), '+.2f')} "
                f"| {_f(g(s, f'aiohttp_{tag}_added_p{q}_ms'), '+.2f')} "
                f"| {_f(g(p, f'litellm_{tag}_added_p{q}_ms'), '+.2f')} "
                f"| {_f(g(lim, f'proxy_added_{tag}_p{q}_ms'), '+.2f')} |"
            )
    for c, label in (("c1", "1 caller"), ("cmany", "50 callers")):
        rows.append(
            f"| events/s received, {label}, 200 fragments | {_f(g(lim, 'direct_events_per_s'))} "
            f"(direct, full speed, many callers) | {_f(g(s, f'full_{c}_events_per_s'))} "
            f"| {_f(g(s, f'bare_{c}_events_per_s'))} | — "
            f"| {_f(g(p, f'litellm_{c}_events_per_s'))} | {_f(g(lim, 'proxy_events_per_s'))} |"
        )
        rows.append(
            f"| CPU ms per 1,000 events, all processes, {label} | | "
            f"{_f(g(s, f'full_{c}_cpu_ms_per_1k_total'), '.0f')} "
            f"| {_f(g(s, f'bare_{c}_cpu_ms_per_1k_total'), '.0f')} | — "
            f"| {_f(g(p, f'litellm_{c}_cpu_ms_per_1k_total'), '.0f')} | |"
        )
    rows += _per_process(fig)
    return "\n".join(rows)


def _per_process(fig: Figures) -> list[str]:
    out = [
        "",
        "CPU ms per 1,000 events by process, 50 callers at full speed:",
        "",
        "| process | tokenwire full stack | tokenwire, frames off (the wire before frames) "
        "| LiteLLM side |",
        "| --- | ---: | ---: | ---: |",
    ]
    names = (
        "gateway",
        "assembler",
        "telemetry",
        "nats",
        "scripted-provider",
        "scripted",
        "litellm",
        "load",
        "total",
    )
    for n in names:
        a = fig.get("stack", f"full_cmany_cpu_ms_per_1k_{n}")
        v1 = fig.get("stack", f"v1_cmany_cpu_ms_per_1k_{n}")
        b = fig.get("peer", f"litellm_cmany_cpu_ms_per_1k_{n}")
        if not (math.isnan(a) and math.isnan(b)):
            out.append(f"| {n} | {_f(a, '.1f')} | {_f(v1, '.1f')} | {_f(b, '.1f')} |")
    return out


TARGETS = (("ttft", "lone caller, provider's first token after 50 ms"), ("hot", "50 paced callers"))
"""The added-first-byte targets (issue 19 as issue 30 settled it): against a provider with a
real time to first token, and under load. The lone caller against the 1 ms provider is a
record, not a target (ADR 0022: the step claim stays a broker round trip per step)."""


def targets_table(fig: Figures) -> str:
    g = fig.get
    rows = [
        "| target (issue 19, as settled by issue 30; issue 27) | tokenwire | baseline | ratio "
        "| met |",
        "| --- | --- | --- | --- | --- |",
    ]
    for tag, label in TARGETS:
        for q in (50, 99):
            ours, peer = _added(fig, tag, q)
            met = "—" if math.isnan(peer) else ("yes" if ours <= peer / 10 else "no")
            rows.append(
                f"| added TTFB <= 1/10 of the peer's, {label}, p{q} | {_f(ours, '+.2f')} ms "
                f"| {_f(peer, '+.2f')} ms | {_ratio(ours, peer)} | {met} |"
            )
    for q in (50, 99):
        ours, peer = _added(fig, "lone", q)
        rows.append(
            f"| (record, not a target: ADR 0022) added TTFB, lone caller, 1 ms provider, "
            f"p{q} | {_f(ours, '+.2f')} ms | {_f(peer, '+.2f')} ms "
            f"| {_ratio(ours, peer)} | record |"
        )
    ours_cpu, peer_cpu = (
        g("stack", "full_cmany_cpu_ms_per_1k_total"),
        g("peer", "litellm_cmany_cpu_ms_per_1k_total"),
    )
    gain = peer_cpu / ours_cpu if ours_cpu and not math.isnan(peer_cpu) else float("nan")
    met = "—" if math.isnan(gain) else ("yes" if gain >= 10 else "no")
    rows.append(
        f"| >= 10x the peer's chunks per CPU second (all processes, 50 callers) "
        f"| {_f(ours_cpu, '.0f')} ms/1k | {_f(peer_cpu, '.0f')} ms/1k (peer) | {_f(gain, '.1f')}x | {met} |"
    )
    return "\n".join(rows + _issue27_rows(fig))


def _lower(base: float, ours: float, times: float) -> tuple[str, str]:
    """(how many times lower ``ours`` is than ``base``, whether that is at least ``times``)."""
    if math.isnan(base) or math.isnan(ours) or ours <= 0:
        return "—", "—"
    gain = base / ours
    return f"{gain:.2f}x", "yes" if gain >= times else "no"


def _issue27_rows(fig: Figures) -> list[str]:
    """Issue 27's targets, each a same-run ratio: the full stack against the same build with
    frames off (the wire before frames, ``v1``), and against the peer."""
    g = fig.get
    rows = _interleaved_rows(fig)
    ours, v1 = (
        g("stack", "full_cmany_cpu_ms_per_1k_total"),
        g("stack", "v1_cmany_cpu_ms_per_1k_total"),
    )
    ratio, met = _lower(v1, ours, 2)
    kind = "(record: windows minutes apart)" if rows else "(issue 27)"
    rows.append(
        f"| CPU ms per 1,000 events, all processes, 50 callers: >= 2x lower than frames "
        f"off {kind} | {_f(ours, '.1f')} ms/1k | {_f(v1, '.1f')} ms/1k (frames off) "
        f"| {ratio} lower | {met if kind == '(issue 27)' else 'record'} |"
    )
    for tag, label, kind in (
        ("paced", "paced sessions at 50 tokens/s", "target"),
        ("cmany", "50 callers at full speed", "record"),
    ):
        ours, v1 = (
            g("stack", f"full_{tag}_bytes_per_chunk"),
            g("stack", f"v1_{tag}_bytes_per_chunk"),
        )
        ratio, met = _lower(v1, ours, 2)
        what = f"bytes per retained chunk, {label}"
        head = (
            f"{what}: >= 2x lower than frames off (issue 27)"
            if kind == "target"
            else (f"(record) {what}")
        )
        rows.append(
            f"| {head} | {_f(ours)} B | {_f(v1)} B (frames off) | {ratio} lower "
            f"| {met if kind == 'target' else 'record'} |"
        )
    ours, peer = (
        g("stack", "full_cmany_cpu_ms_per_1k_total"),
        g("peer", "litellm_cmany_cpu_ms_per_1k_total"),
    )
    ratio, met = _lower(peer, ours, 25)
    interleaved = not math.isnan(fig.get("interleaved", "peer_over_full_median"))
    kind = "(record: windows minutes apart)" if interleaved else "(issue 27)"
    rows.append(
        f"| >= 25x the peer's chunks per CPU second, all processes, 50 callers {kind} "
        f"| {_f(ours, '.1f')} ms/1k | {_f(peer, '.0f')} ms/1k (peer) | {ratio} "
        f"| {'record' if interleaved else met} |"
    )
    upstream = g("stack", "full_cmany_cpu_ms_per_1k_scripted-provider")
    peer_upstream = g("peer", "litellm_cmany_cpu_ms_per_1k_scripted")
    v1_upstream = g("stack", "v1_cmany_cpu_ms_per_1k_scripted-provider")
    own, v1_own = ours - upstream, g("stack", "v1_cmany_cpu_ms_per_1k_total") - v1_upstream
    ratio_v1, _ = _lower(v1_own, own, 2)
    ratio_peer, _ = _lower(peer - peer_upstream, own, 25)
    rows.append(
        f"| (record) the same without the upstream simulator's CPU (the scripted provider, "
        f"not part of either pipeline) | {_f(own, '.1f')} ms/1k | {_f(v1_own, '.1f')} "
        f"(frames off), {_f(peer - peer_upstream, '.0f')} (peer) ms/1k "
        f"| {ratio_v1} lower, {ratio_peer} | record |"
    )
    return rows


def _interleaved_rows(fig: Figures) -> list[str]:
    """Issue 27's CPU targets from alternating windows (bench/bench_interleaved.py): the
    median over the rounds of each round's ratio, and its range; [] when not measured."""
    g, phase, rows = fig.get, "interleaved", []
    rounds = g(phase, "rounds")
    ours = g(phase, "full_cpu_ms_per_1k_total")
    for other, label, times, unit in (("v1", "frames off", 2, " lower"), ("peer", "peer", 25, "")):
        median = g(phase, f"{other}_over_full_median")
        if math.isnan(median):
            continue
        low, high = g(phase, f"{other}_over_full_min"), g(phase, f"{other}_over_full_max")
        what = (
            ">= 2x lower than frames off"
            if other == "v1"
            else ">= 25x the peer's chunks per CPU second"
        )
        rows.append(
            f"| CPU ms per 1,000 events, all processes, 50 callers: {what} (issue 27; "
            f"alternating windows, median of {rounds:.0f} rounds) | {_f(ours, '.1f')} ms/1k "
            f"| {_f(g(phase, f'{other}_cpu_ms_per_1k_total'), '.1f')} ms/1k ({label}) "
            f"| {median:.2f}x{unit} (rounds {low:.2f}-{high:.2f}) "
            f"| {'yes' if median >= times else 'no'} |"
        )
    return rows


def _added(fig: Figures, tag: str, q: int) -> tuple[float, float]:
    """Added first byte at quantile ``q`` of a scenario: the full stack's and the peer's."""
    return fig.get("stack", f"full_{tag}_added_p{q}_ms"), fig.get(
        "peer", f"litellm_{tag}_added_p{q}_ms"
    )


def ratios_table(fig: Figures) -> str:
    g = fig.get
    lim = "limits"
    rows = [
        (
            "gateway durable chunks/s, bench_gateway (b), 100 fragments",
            g("gateway", "b_chunks_per_s"),
            "pipelined publish with acks",
            g(lim, "publish_per_s"),
            g("gateway", "b_limit_per_s"),
        ),
        (
            "gateway on the full stack, 50 callers, events/s",
            g("stack", "full_cmany_events_per_s"),
            "pipelined publish with acks",
            g(lim, "publish_per_s"),
            float("nan"),
        ),
        (
            "assembler to SQLite, chunks/s",
            g("assembler", "sqlite_per_s"),
            "callback consumer acking every message",
            g(lim, "consume_ack_per_s"),
            g("assembler", "raw_batch_per_s"),
        ),
        (
            "assembler to PostgreSQL, chunks/s",
            g("assembler", "postgres_per_s"),
            "callback consumer acking every message",
            g(lim, "consume_ack_per_s"),
            g("assembler", "raw_batch_per_s"),
        ),
        (
            "replay (read_session), chunks/s",
            g("replay", "replay_per_s"),
            "ordered-consumer read",
            g(lim, "ordered_read_per_s"),
            g("replay", "raw_per_s"),
        ),
    ]
    out = [
        "| tokenwire | figure | its limit | limit (limits phase) | ratio | same limit measured "
        "beside it in its own phase | ratio |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    out += [
        f"| {a} | {_f(x)} | {b} | {_f(y)} | {_ratio(x, y)} | {_f(z)} | {_ratio(x, z)} |"
        for a, x, b, y, z in rows
    ]
    e2e = [g("stack", f"e2e_provider_to_commit_p{q}_ms") for q in (50, 90, 99)]
    out.append(
        f"| provider byte -> store commit, full stack, p50 / p90 / p99 ms "
        f"| {' / '.join(_f(x, '.1f') for x in e2e)} | | | | | |"
    )
    out.append(
        f"| telemetry deliveries per step (full stack) "
        f"| {_f(g('stack', 'telemetry_deliveries_per_step'), '.2f')} | one per step | 1 | | | |"
    )
    return "\n".join(out)


def breakdown_table(fig: Figures) -> str:
    from bench.bench_stack import PHASES

    labels = {
        "caller_to_app": "caller write -> gateway app entry (loopback hop, HTTP parse, wake-up)",
        "app_to_claim": "app entry -> step claim sent (validation, routing)",
        "claim_to_provider_post": "claim sent -> provider request sent",
        "provider_post_to_wait": "step set-up while the provider works",
        "provider_wait_to_headers": "set up -> provider's response headers (rest of the hop)",
        "headers_to_first_read": "headers -> first body bytes from the provider",
        "first_read_to_claim_wait": "first provider bytes -> first chunk normalised, needs the claim",
        "claim_wait": "waiting for the step claim's answer (sent before the provider call)",
        "claim_to_publish": "claim known -> first chunk publish",
        "publish_to_first_send": "first publish -> first body write to the caller",
        "send_to_caller": "first body write -> caller's first byte (loopback hop, wake-up)",
    }
    rows = ["| phase (lone caller, full stack, p50 of each) | ms |", "| --- | ---: |"]
    total = 0.0
    for p in PHASES:
        v = fig.get("stack", f"marks_{p}_p50_ms")
        total += 0 if math.isnan(v) else v
        rows.append(f"| {labels[p]} | {_f(v, '.3f')} |")
    rows.append(f"| sum of the p50s | {total:.3f} |")
    rows.append(
        f"| direct call to the provider, first byte p50 | {_f(fig.get('stack', 'full_lone_direct_p50_ms'), '.3f')} |"
    )
    return "\n".join(rows)


def plots(fig: Figures, out: Path) -> list[str]:
    """PNG plots under ``out``; the names written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    bars = [("direct", fig.get("stack", "full_lone_direct_p50_ms"), False)]
    bars += [
        ("bare proxy", fig.get("limits", "proxy_added_lone_p50_ms"), True),
        ("tokenwire\nno consumers", fig.get("stack", "bare_lone_added_p50_ms"), True),
        ("tokenwire\nfull stack", fig.get("stack", "full_lone_added_p50_ms"), True),
        ("tokenwire\naiohttp", fig.get("stack", "aiohttp_lone_added_p50_ms"), True),
        ("LiteLLM", fig.get("peer", "litellm_lone_added_p50_ms"), True),
    ]
    bars = [(n, v, a) for n, v, a in bars if not math.isnan(v)]
    f, ax = plt.subplots(figsize=(8, 4))
    ax.bar([b[0] for b in bars], [b[1] for b in bars], color=["grey"] + ["C0"] * (len(bars) - 1))
    ax.set_ylabel("ms (direct: absolute; others: added, p50)")
    ax.set_title("Time to first byte, lone sequential caller")
    f.tight_layout()
    f.savefig(out / "bench-ttfb-lone.png", dpi=90)
    plt.close(f)
    written.append("bench-ttfb-lone.png")
    for phase, curves in fig.curves.items():
        for name, points in curves.items():
            if not points:
                continue
            f, ax = plt.subplots(figsize=(6, 3.5))
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o")
            xlabel, ylabel = fig.notes.get(f"axis:{phase}:{name}", "x|y").split("|")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            if phase == "scaling" and name in ("step_cost", "sessions"):
                ax.set_xscale("log")
            ax.set_ylim(bottom=0)
            ax.set_title(name.replace("_", " "))
            f.tight_layout()
            fname = f"bench-{phase}-{name}.png"
            f.savefig(out / fname, dpi=90)
            plt.close(f)
            written.append(fname)
    return written


def generated(fig: Figures, images: list[str], preliminary: bool) -> str:
    m = fig.machine
    head = [
        BEGIN,
        "",
        "## One run: limits, tokenwire, the peer (generated by `make bench`)",
        "",
        f"Profile `{fig.profile}`, {m.get('when_utc', '?')}, {m.get('cores', '?')} cores, "
        f"Python {m.get('python', '?')}, {m.get('system', '?')}, load average at start "
        f"{m.get('load_at_start', '?')}. Phases and their wall time: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in fig.seconds.items())
        + ".",
        "",
    ]
    if preliminary:
        head += [
            "**Preliminary, measured under load** (other work ran on the 2 cores during "
            "this run; the ratios hold better than the absolute rates). Regenerate with "
            "`make bench` on a quiet machine.",
            "",
        ]
    peer_note = fig.notes.get("peer", "")
    body = [
        "### tokenwire against the peer, same upstream, same scenarios",
        "",
        "tokenwire captures every chunk durably (JetStream, acknowledged before the step ends, "
        "assembled into the store); the peer only forwards. " + peer_note + ".",
        "",
        stack_table(fig),
        "",
        targets_table(fig),
        "",
        "### Issue 27's CPU targets in alternating windows (bench/bench_interleaved.py)",
        "",
        "The full stack, the same build with frames off and the peer stand side by side; each "
        "round runs the 50 callers at full speed against each in turn (rotated), so each "
        "round's ratios come from adjacent windows (tokenwire's two with three times the "
        "peer's requests per caller: their windows would otherwise last 2-3 s). CPU ms "
        "per 1,000 events, all processes:",
        "",
        fig.tables.get("interleaved", "(not run)"),
        "",
        "### The gateway against relaying floors at 50 tokens/s (bench/bench_floor.py)",
        "",
        "The gateway, a bare proxy (uvicorn + aiohttp) and a TCP relay (uvloop protocols, "
        "parses nothing), each in front of the same paced scripted provider, in alternating "
        "rounds of the same paced load; each process's own CPU per token streamed "
        "(docs/capacity.md applies the ratios to the model):",
        "",
        fig.tables.get("floor", "(not run)"),
        "",
        "### The limits, measured first in the same run",
        "",
        fig.tables.get("limits", "(not run)"),
        "",
        "### Each part as a ratio to its limit",
        "",
        ratios_table(fig),
        "",
        "### Where a lone caller's time to first byte goes (gateway timing marks)",
        "",
        breakdown_table(fig),
        "",
        "### Scaling",
        "",
        fig.tables.get("scaling", "(not run)"),
        "",
        *[f"![{i}](img/{i})" for i in images],
        "",
    ]
    for phase in ("gateway", "routes", "assembler", "replay", "telemetry", "publish"):
        if phase in fig.tables:
            body += [f"### bench_{phase} (this run)", "", fig.tables[phase], ""]
    return "\n".join(head + body + [END])


def write_doc(doc: Path, section: str) -> None:
    text = doc.read_text() if doc.is_file() else "# Benchmarks\n"
    if BEGIN in text and END in text:
        before, rest = text.split(BEGIN, 1)
        after = rest.split(END, 1)[1]
        text = before + section + after
    else:
        parts = text.split("\n## ", 1)
        text = (
            parts[0].rstrip()
            + "\n\n"
            + section
            + "\n"
            + ("\n## " + parts[1] if len(parts) > 1 else "")
        )
    doc.write_text(text)
