"""``tokenwire status``: broker, the chunk streams (one per shard: leader, messages, bytes,
consumers, lag, hours of replay the retention budget holds), partitions, consumers and their
lag, retired layouts, the routed deployments held back (shared cooldowns), store.

Streams and consumers are read with plain JetStream API requests (``$JS.API.STREAM.INFO``,
``$JS.API.CONSUMER.LIST``) because nats-py's typed ConsumerInfo drops the priority-group
state that names a partition's current owner (the pinned client).
"""

from __future__ import annotations

import time
from typing import Any, assert_never

import click
import msgspec

from tokenwire.broker import (
    BrokerError,
    Connection,
    Cooldowns,
    Cooling,
    Healthy,
    ProbeDue,
    Probing,
    Topology,
    jetstream_request,
    retired_layouts,
    server_info,
)
from tokenwire.cli._common import (
    nats_client,
    opened_store,
    resolve_nats_url,
    resolve_store_url,
    run_command,
    topology,
)
from tokenwire.cli._errors import UnreachableError
from tokenwire.cli._flags import variable_flags
from tokenwire.cli._retention import format_replay, shard_retention, total_retention
from tokenwire.cli._shares import member_shares, name_owners
from tokenwire.store import StoreError, redact

_NS = 1_000_000_000
_MAX_CONSUMER_PAGES = 20


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@variable_flags("status")
def status(as_json: bool) -> None:
    """Show the broker, streams, partitions, consumers (lag, owners) and the store."""
    url, store_url = resolve_nats_url(), resolve_store_url()
    report: dict[str, Any] = {}

    async def work() -> None:
        report.update(await _status(url, store_url))

    run_command(work)
    if as_json:
        click.echo(msgspec.json.encode(report).decode())
    else:
        _print(report)


async def _status(url: str, store_url: str) -> dict[str, Any]:
    t = topology()
    async with nats_client(url) as nc:
        report: dict[str, Any] = {"broker": _broker(nc, url), "partitions": t.partitions}
        report["shards"] = t.shards
        report["streams"] = await _shards(nc, t)
        report["retention"] = total_retention([s for s in report["streams"] if s["provisioned"]])
        report["consumers"] = []
        for s in report["streams"]:
            if s["provisioned"]:
                report["consumers"] += await _consumers(nc, s["name"])
        report["retired"] = await _retired(nc, t)
        report["members"] = await member_shares(nc, t)
        name_owners(report["consumers"], report["members"])
        report["registry"] = [await _side_stream(nc, f"KV_{b}") for b in t.registry_buckets]
        report["events"] = [await _side_stream(nc, name) for name in t.events_streams]
        report["dlq_stream"] = await _stream(nc, t.dlq_stream)
        report["cooldowns"] = await _cooldowns(nc, t)
    report["store"] = await _store(store_url)
    return report


def _broker(nc: Connection, url: str) -> dict[str, Any]:
    info = server_info(nc)
    return {
        "url": redact(info.url or url),
        "server_version": info.version,
        "server_name": info.name,
        "jetstream": info.jetstream,
    }


async def _request(nc: Connection, subject: str, body: dict[str, Any] | None = None) -> Any:
    try:
        return await jetstream_request(nc, subject, body, timeout_s=5.0)
    except BrokerError as exc:
        return {"error": {"description": str(exc)}}


async def _shards(nc: Connection, t: Topology) -> list[dict[str, Any]]:
    """One entry per shard: its stream's state, leader, retention, and lag (its assembler
    consumers' undelivered messages)."""
    shards = []
    for k, name in enumerate(t.chunk_streams):
        entry: dict[str, Any] = {"shard": k, "partitions": _ranges(list(t.shard_partitions(k)))}
        stream = await _stream(nc, name)
        entry |= stream or {"name": name, "provisioned": False}
        if stream is not None:
            entry["lag"] = await _lag(nc, t, k)
        shards.append(entry)
    return shards


async def _lag(nc: Connection, t: Topology, shard: int) -> int:
    """Undelivered messages over the shard's assembler consumers (its partitions')."""
    lag = 0
    for p in t.shard_partitions(shard):
        info = await _request(
            nc, f"$JS.API.CONSUMER.INFO.{t.shard_stream(shard)}.{t.assembler_consumer(p)}"
        )
        lag += int(info.get("num_pending", 0))
    return lag


async def _retired(nc: Connection, t: Topology) -> list[dict[str, Any]]:
    """The retired layouts whose streams still hold data (until it ages out)."""
    try:
        layouts = await retired_layouts(nc, t)
    except BrokerError as exc:
        return [{"error": str(exc)}]
    found = []
    for layout in layouts:
        for name in layout.chunk_streams:
            stream = await _stream(nc, name)
            if stream is not None:
                found.append({"layout": layout.layout} | stream)
    return found


async def _side_stream(nc: Connection, name: str) -> dict[str, Any]:
    """A stream that is not a chunk stream, or that it is not provisioned."""
    return await _stream(nc, name) or {"name": name, "provisioned": False}


async def _stream(nc: Connection, name: str) -> dict[str, Any] | None:
    data = await _request(nc, f"$JS.API.STREAM.INFO.{name}")
    if "error" in data:
        return None
    config, state = data.get("config", {}), data.get("state", {})
    cluster = data.get("cluster") or {}
    stream = {
        "name": name,
        "provisioned": True,
        "leader": cluster.get("leader"),
        "followers": [r.get("name") for r in cluster.get("replicas") or []],
        "messages": state.get("messages", 0),
        "bytes": state.get("bytes", 0),
        "first_seq": state.get("first_seq", 0),
        "last_seq": state.get("last_seq", 0),
        "retention": config.get("retention"),
        "max_age_s": config.get("max_age", 0) / _NS,
        "max_bytes": config.get("max_bytes"),
        "compression": config.get("compression", "none"),
        "replicas": config.get("num_replicas"),
        "consumers": state.get("consumer_count", 0),
    }
    return stream | {"replay": shard_retention(config, state)}


async def _consumers(nc: Connection, stream: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for _ in range(_MAX_CONSUMER_PAGES):
        page = await _request(nc, f"$JS.API.CONSUMER.LIST.{stream}", {"offset": len(found)})
        items = page.get("consumers") or []
        found += [_consumer(c) for c in items]
        if not items or len(found) >= page.get("total", 0):
            break
    return sorted(found, key=lambda c: (c["durable"] is None, _natural(c["name"])))


def _natural(name: str) -> tuple[str, int]:
    """``assembler-p2`` before ``assembler-p10``."""
    head = name.rstrip("0123456789")
    tail = name[len(head) :]
    return head, int(tail) if tail else -1


def _consumer(info: dict[str, Any]) -> dict[str, Any]:
    config = info.get("config", {})
    owners = [g.get("pinned_client_id") for g in info.get("priority_groups") or []]
    return {
        "stream": info.get("stream_name"),
        "name": info.get("name"),
        "durable": config.get("durable_name"),
        "filter": config.get("filter_subject"),
        "num_pending": info.get("num_pending", 0),
        "ack_pending": info.get("num_ack_pending", 0),
        "redelivered": info.get("num_redelivered", 0),
        "waiting": info.get("num_waiting", 0),
        "owner": next((o for o in owners if o), None),
    }


async def _cooldowns(nc: Connection, t: Topology) -> list[dict[str, Any]]:
    """The routed deployments held back now (shared cooldowns: cooling down, or probed by one
    gateway), from the cooldowns bucket; nothing when the bucket is not provisioned."""
    try:
        states = await Cooldowns(nc, t.cooldowns_bucket).states()
    except BrokerError:
        return []
    now_ns = time.time_ns()
    out: list[dict[str, Any]] = []
    for state in states:
        match state:
            case Cooling():
                left = max(0.0, (state.until_ns - now_ns) / _NS)
                out.append(
                    {
                        "deployment": state.deployment,
                        "state": "cooling",
                        "seconds_left": round(left, 1),
                        "reason": state.reason,
                    }
                )
            case Probing():
                out.append({"deployment": state.deployment, "state": "probing"})
            case ProbeDue():
                out.append({"deployment": state.deployment, "state": "probe due"})
            case Healthy():
                pass
            case _:
                assert_never(state)
    return out


async def _store(url: str) -> dict[str, Any]:
    try:
        async with opened_store(url) as store:
            stats = await store.stats()
            return {"url": store.url, "stats": msgspec.to_builtins(stats)}
    except (StoreError, UnreachableError) as exc:
        return {"url": redact(url), "error": redact(str(exc))}


def _print(report: dict[str, Any]) -> None:
    broker = report["broker"]
    click.secho(
        f"broker  {broker['url']}  nats-server {broker['server_version']}"
        f"  ({broker['server_name']})",
        bold=True,
    )
    click.echo(
        f"layout  {report['shards']} shard{'s' if report['shards'] > 1 else ''}"
        f" over {report['partitions']} partitions"
    )
    for s in report["streams"]:
        if not s["provisioned"]:
            click.secho(
                f"shard {s['shard']} {s['name']}  not provisioned (start the services,"
                " or `tokenwire up`)",
                fg="yellow",
            )
            continue
        _print_stream(f"shard {s['shard']}", s)
        click.echo(
            f"        partitions {s['partitions']}  leader {s['leader'] or '-'}  "
            f"lag {s['lag']}  replay {format_replay(s['replay'])}"
        )
    if report["streams"] and any(s["provisioned"] for s in report["streams"]):
        click.echo(f"        all shards: replay {format_replay(report['retention'])}")
    for r in report.get("retired", []):
        if "error" in r:
            click.secho(f"retired {r['error']}", fg="yellow")
        else:
            _print_stream("retired", r)
    for m in report.get("members", []):
        owned = m["owned"]
        standby = f"  standing by {_ranges(m['standby'])}" if m.get("standby") else ""
        click.echo(
            f"  member {m['name']:<26} share {m['share']:>3}  owns {len(owned):>3}  "
            f"in flight {m['in_flight']:>6}  partitions {_ranges(owned)}" + standby
        )
    for c in report["consumers"]:
        who = c.get("owner_member") or c["owner"]
        owner = f"  owner {who}" if who else ""
        name = f"{c['stream']}/{c['name']}"
        click.echo(
            f"  consumer {name:<36} pending {c['num_pending']:>8}  ack pending "
            f"{c['ack_pending']:>6}  redelivered {c['redelivered']}{owner}"
        )
    _print_side_streams(report)
    for c in report.get("cooldowns", []):
        left = f"  {c['seconds_left']:g} s left  {c['reason']}" if c["state"] == "cooling" else ""
        click.secho(f"deployment {c['deployment']}  {c['state']}{left}", fg="yellow")
    store = report["store"]
    detail = store.get("error") or "  ".join(f"{k} {v}" for k, v in store["stats"].items())
    click.echo(f"store   {store['url']}  {detail}")


def _ranges(partitions: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``0-2,5``."""
    out: list[str] = []
    for p in partitions:
        if out and out[-1].split("-")[-1] == str(p - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{p}"
        else:
            out.append(str(p))
    return ",".join(out) or "-"


def _print_side_streams(report: dict[str, Any]) -> None:
    """The step registry's buckets, the events and the dead-letter streams."""
    for label in ("registry", "events"):
        for stream in report[label]:
            if stream["provisioned"]:
                _print_stream(label, stream)
            else:
                click.echo(f"{label:<8} {stream['name']}  not provisioned")
    if report["dlq_stream"] is not None:
        _print_stream("dlq", report["dlq_stream"])


def _print_stream(label: str, s: dict[str, Any]) -> None:
    click.echo(
        f"{label:<7} {s['name']}  {s['messages']} messages  {s['bytes']} bytes  "
        f"stream seq {s['first_seq']}-{s['last_seq']}  retention {s['retention']}  "
        f"max_age {s['max_age_s']:.0f} s  max_bytes {s['max_bytes']}  replicas {s['replicas']}  "
        f"compression {s.get('compression', 'none')}"
    )
