"""The ledger's Prometheus counters: counted once per inserted step, after its commit."""

from __future__ import annotations

from collections import Counter

import msgspec
from nats.aio.client import Client

from tests.assembler.harness import Plan, publish_plan, settings_for
from tests.assembler.scripts import Script, error_step, reasoning_step, text_step, tools_step
from tokenwire.broker import Topology, chunk_subject
from tokenwire.schemas import ChunkEnvelope, json_encoder
from tokenwire.services.assembler import run
from tokenwire.store import Store

T0 = 1_767_571_200 * 10**9  # 2026-01-05, a date genai-prices has prices for


def owned(envs: list[ChunkEnvelope], provider: str, model: str, tenant: str | None):
    """The envelopes as a named key of ``tenant`` sent them to ``provider/model``."""
    out = [
        msgspec.structs.replace(e, provider=provider, model=model, time_ns=T0 + e.ordinal)
        for e in envs
    ]
    if tenant is not None:
        out[0] = msgspec.structs.replace(out[0], key_name=f"{tenant}-key", tenant=tenant)
    return out


def plan_of(steps: list[tuple[str, Script, str, str, str | None]]) -> Plan:
    plan = Plan()
    for i, (session, script, provider, model, tenant) in enumerate(steps):
        envs = owned(plan.add(session, 0, i, script), provider, model, tenant)
        turn, step, _, _ = plan.steps[session][-1]
        plan.steps[session][-1] = (turn, step, script, envs)
    return plan


def samples(metric) -> dict[tuple[str, ...], float]:
    return {
        tuple(s.labels.values()): s.value
        for family in metric.collect()
        for s in family.samples
        if s.name.endswith("_total")
    }


async def test_counters_equal_the_reported_usage_once_per_step(
    nc: Client, nats_url: str, topology: Topology, db_url: str, db: Store
) -> None:
    steps = [
        ("u1", text_step(["a ", "b ", "c"]), "openai", "gpt-4o-mini", "acme"),
        ("u1", reasoning_step(["think"], ["ok"]), "deepseek", "deepseek-reasoner", "acme"),
        ("u2", text_step(["x"]), "scripted", "text", None),  # reported, not priced
        ("u2", tools_step("Oslo"), "openai", "gpt-4o-mini", None),  # no usage at all
        ("u3", error_step(), "anthropic", "claude-sonnet-4-5", "beta"),
    ]
    plan = plan_of(steps)
    await publish_plan(nc, topology, plan, seed=3)
    first = await run(settings_for(nats_url, topology, db_url))

    expected: Counter[tuple[str, ...]] = Counter()
    unpriced: Counter[tuple[str, ...]] = Counter()
    for _, script, provider, model, tenant in steps:
        usage = script.expected.usage
        labels = (provider, model, tenant or "none")
        for name in usage.__struct_fields__ if usage is not None else ():
            if n := getattr(usage, name):
                expected[(*labels, name.removesuffix("_tokens"))] += n
        if usage is None or provider == "scripted":
            unpriced[labels] += 1
    usage_metrics = first.metrics.usage
    assert samples(usage_metrics.tokens) == dict(expected)
    assert samples(usage_metrics.unpriced) == dict(unpriced)
    lines = [li for s in ("u1", "u2", "u3") for li in await db.session_usage(s)]
    costs = {(li.provider, li.model, li.tenant or "none"): li.cost_usd for li in lines}
    priced = {k: float(v) for k, v in costs.items() if v is not None}
    assert set(priced) == {
        ("openai", "gpt-4o-mini", "acme"),
        ("deepseek", "deepseek-reasoner", "acme"),
    }
    assert samples(usage_metrics.cost) == priced

    # The same chunks again under new Msg-Ids, then a second instance: nothing counted twice.
    js = nc.jetstream()
    for envs in (e for runs in plan.steps.values() for *_, e in runs):
        for env in envs:
            subject = chunk_subject(topology, env.session, env.ordinal == 0)
            headers = {"Nats-Msg-Id": f"again:{env.session}:{env.step}:{env.ordinal}"}
            await js.publish(subject, json_encoder.encode(env), headers=headers)
    second = await run(settings_for(nats_url, topology, db_url))
    assert samples(second.metrics.usage.tokens) == {}
    assert samples(second.metrics.usage.cost) == {}
    assert second.metrics.duplicates.labels("store")._value.get() == len(steps)
    assert [li for s in ("u1", "u2", "u3") for li in await db.session_usage(s)] == lines
