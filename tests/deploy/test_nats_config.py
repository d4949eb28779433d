"""deploy/nats: the node configs are valid for the real server, and the users' permissions
allow exactly what each service does (proved on a real server with the real library calls)."""

from __future__ import annotations

import asyncio
import difflib
import re
import subprocess
from pathlib import Path

import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import ConsumerConfig

from tests.deploy._files import NATS_DIR
from tests.deploy._nats import (
    Connection,
    Node,
    NodePorts,
    close,
    connect_as,
    loopback_config,
    provision,
    run_provision,
    running,
    server_env,
    write_node_configs,
)
from tests.fixtures.partitions import AssemblerConsumers
from tokenwire.broker import (
    Allowances,
    ChunkPublisher,
    ConsumedMessage,
    Cooldowns,
    Cooling,
    KeyEntry,
    KeysBucket,
    Pool,
    PullConsumer,
    SessionReader,
    StepClaims,
    StepRegistry,
    Topology,
    check_layout,
    find_binary,
    free_port,
    ordered_subscribe,
    partition_of,
    publish_acked,
    publish_event,
    read_range,
    stored_with_msg_id,
)
from tokenwire.replay import read_session
from tokenwire.schemas import (
    ChunkEnvelope,
    Finish,
    KeyRecord,
    StreamChunk,
    TextDelta,
    TokenUsage,
    Usage,
    json_encoder,
)

NODE_FILES = [NATS_DIR / f"nats-{i}.conf" for i in (1, 2, 3)]


@pytest.mark.parametrize("path", NODE_FILES, ids=lambda p: p.name)
def test_node_config_is_valid_for_nats_server(path: Path) -> None:
    result = subprocess.run(
        [find_binary(), "-t", "-c", str(path)],
        env=server_env(),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == 0, result.stderr + result.stdout


def test_a_missing_password_variable_is_refused() -> None:
    """The passwords really come from the environment (nothing secret in the files)."""
    env = {k: v for k, v in server_env().items() if k != "NATS_GATEWAY_PASSWORD"}
    result = subprocess.run(
        [find_binary(), "-t", "-c", str(NODE_FILES[0])],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode != 0
    assert "NATS_GATEWAY_PASSWORD" in result.stderr + result.stdout


def test_node_configs_differ_only_in_server_name() -> None:
    texts = [p.read_text() for p in NODE_FILES]
    for i, text in enumerate(texts, start=1):
        assert f"\nserver_name: nats-{i}\n" in text
        assert "\ninclude ./accounts.conf\n" in text
    unnamed = [re.sub(r"\nserver_name: nats-\d\n", "\n", t) for t in texts]
    assert unnamed[0] == unnamed[1] == unnamed[2]


def test_the_loopback_rewrite_changes_only_addresses_and_the_store(tmp_path: Path) -> None:
    original = NODE_FILES[1].read_text()
    rewritten = loopback_config(original, NodePorts(1001, 1002, 1003), [2001, 2002, 2003], tmp_path)
    changed = [
        line
        for line in difflib.unified_diff(original.splitlines(), rewritten.splitlines(), n=0)
        if line.startswith("-") and not line.startswith("---")
    ]
    assert sorted(s.strip("- ") for s in changed) == sorted(
        [
            "listen: 0.0.0.0:4222",
            "http: 0.0.0.0:8222",
            "listen: 0.0.0.0:6222",
            "store_dir: /data/jetstream",
            "nats-route://nats-1:6222",
            "nats-route://nats-2:6222",
            "nats-route://nats-3:6222",
        ]
    )


def _publish(block: str, rule: str = "allow") -> list[str]:
    """The subjects of ``block``'s publish ``rule`` (allow: its list; deny: the variable)."""
    text = (NATS_DIR / "accounts.conf").read_text()
    body = text.split(f"\n{block} = {{", 1)[1].split("\n}", 1)[0]
    publish = body.split("publish:", 1)[1].split("subscribe:", 1)[0]
    if rule == "allow":
        return re.findall(r'"([^"]+)"', publish.split("allow: [", 1)[1].split("]", 1)[0])
    variable = re.search(r"deny: \$(\w+)", publish)
    if variable is None:
        return []
    listed = text.split(f"\n{variable.group(1)} = [", 1)[1].split("\n]", 1)[0]
    return re.findall(r'"([^"]+)"', listed)


def _allowed(block: str) -> list[str]:
    return _publish(block, "allow")


def test_assembler_permissions_list_every_partition_consumer() -> None:
    """NATS wildcards are whole tokens, so `assembler-p*` would be a literal: each of the
    16 partitions (TOKENWIRE_PARTITIONS' default) needs its own entries, and no more."""
    allowed = _allowed("ASSEMBLER_PERMISSIONS")
    topology = Topology()
    for verb in ("MSG.NEXT", "UNPIN", "RESET", "INFO", "CREATE"):
        listed = {s for s in allowed if s.startswith(f"$JS.API.CONSUMER.{verb}.")}
        if verb == "CREATE":  # besides: its read-backs' ordered consumers (filtered form)
            listed.discard("$JS.API.CONSUMER.CREATE.*.*.tw.chunks.*.>")
        expected = {  # `*`: on whichever shard stream holds the partition
            f"$JS.API.CONSUMER.{verb}.*.{topology.assembler_consumer(p)}"
            for p in range(topology.partitions)
        }
        assert listed == expected, verb
    acks = {s for s in allowed if s.startswith("$JS.ACK.")}
    assert acks == {f"$JS.ACK.*.assembler-p{p}.>" for p in range(topology.partitions)}


@pytest.mark.parametrize("block", ["GATEWAY_PERMISSIONS", "OPERATOR_PERMISSIONS"])
def test_replay_readers_may_delete_and_pull_consumers_but_never_a_durable_one(block: str) -> None:
    """A replay pulls from and deletes its ephemeral consumer (random name: only the `*` form
    allows it), so every durable consumer of the pipeline must be on the deny list for
    writes and pulls, and nothing else."""
    assert "$JS.API.CONSUMER.DELETE.*.*" in _allowed(block)
    assert "$JS.API.CONSUMER.MSG.NEXT.*.*" in _allowed(block)
    t = Topology()
    durables = [t.assembler_consumer(p) for p in range(t.partitions)]
    durables.append(t.telemetry_consumer)
    registry = (*Topology().registry_buckets, *Topology(registry_shards=3).registry_buckets)
    events = (*Topology().events_streams, *Topology(registry_shards=3).events_streams)
    others = (*events, t.dlq_stream, *(f"KV_{b}" for b in registry), f"KV_{t.members_bucket}")
    assert sorted(_publish(block, "deny")) == sorted(
        [f"$JS.API.CONSUMER.DELETE.*.{d}" for d in durables]
        + [f"$JS.API.CONSUMER.CREATE.*.{d}.>" for d in durables]
        + [f"$JS.API.CONSUMER.DELETE.{s}.*" for s in others]
        + [f"$JS.API.CONSUMER.MSG.NEXT.*.{d}" for d in durables]
    )


def test_the_assembler_may_not_pull_from_a_consumer_it_does_not_own() -> None:
    """Its pulls name its own partition consumers only (never `*`: that would reach the
    telemetry consumer's messages)."""
    pulls = [s for s in _allowed("ASSEMBLER_PERMISSIONS") if ".MSG.NEXT." in s]
    assert pulls
    assert not [s for s in pulls if s.endswith(".*") or s.endswith(".>")]


def test_only_the_replay_readers_may_delete_anything() -> None:
    """... but for the provisioner's one stream of heartbeats: the membership bucket of
    before issue 48 was in memory, and moving it to file storage means deleting it."""
    exception = f"$JS.API.STREAM.DELETE.KV_{Topology().members_bucket}"
    for block in ("PROVISIONER_PERMISSIONS", "ASSEMBLER_PERMISSIONS", "TELEMETRY_PERMISSIONS"):
        deletes = [s for s in _allowed(block) if ".DELETE." in s or ".PURGE." in s]
        assert deletes == ([exception] if block == "PROVISIONER_PERMISSIONS" else []), block


def test_no_permission_uses_a_partial_token_wildcard() -> None:
    """`assembler-p*` or `tw.in.>x` would be literals to NATS, silently matching nothing."""
    subjects = re.findall(r'"([^"]+)"', (NATS_DIR / "accounts.conf").read_text())
    assert subjects
    for subject in subjects:
        for token in subject.split("."):
            assert token in ("*", ">") or not set(token) & {"*", ">"}, subject


def _single_node_config(tmp_path: Path, port: int) -> Path:
    """One JetStream node that includes the committed accounts file unchanged."""
    (tmp_path / "accounts.conf").write_bytes((NATS_DIR / "accounts.conf").read_bytes())
    path = tmp_path / "single.conf"
    path.write_text(
        f"listen: 127.0.0.1:{port}\n"
        f'jetstream {{ store_dir: "{tmp_path / "js"}" }}\n'
        "include ./accounts.conf\n"
    )
    return path


async def _denied(conn: Connection, subject: str) -> None:
    """A request the user may not make: no answer, and a permissions violation."""
    with pytest.raises((NatsTimeoutError, NoRespondersError)):
        await conn.nc.request(subject, b"{}", timeout=0.25)
    for _ in range(20):
        if any(subject.lower() in v.lower() for v in conn.violations()):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no violation for {subject}: {conn.errors}")


# One step as a provider streamed it, written down: the oracle of the replay reads.
STEP: list[StreamChunk] = [
    TextDelta(0, "Bon"),
    TextDelta(0, "jour, "),
    TextDelta(0, "Paris"),
    TextDelta(0, "!"),
    Usage(TokenUsage(input_tokens=9, output_tokens=4)),
    Finish("stop"),
]


SESSIONS = [f"sess-r{i}" for i in range(12)]
"""With R = 3 these sessions use every registry bucket and every events stream."""


async def _gateway_publishes(conn: Connection, topology: Topology) -> None:
    steps = await StepRegistry.open(conn.nc, topology)
    await steps.claim("sess-a", 0, 0)
    assert await steps.next_step("sess-b", True) == (0, 0)
    assert await steps.next_step("sess-b", False) == (0, 1)
    sessions = SESSIONS  # with R = 3, every bucket is written
    for session in sessions:
        assert await steps.next_step(session, True) == (0, 0)
    assert {topology.registry_bucket_of(s) for s in sessions} == set(topology.registry_buckets)
    record = await steps.record("sess-a", 0, 0)  # a read from the bucket's leader
    assert record is not None
    publisher = await ChunkPublisher(conn.nc, topology).start()
    for ordinal, chunk in enumerate(STEP):
        envelope = ChunkEnvelope("sess-a", 0, 0, ordinal, 1_000 + ordinal, "p", "m", chunk)
        payload = json_encoder.encode(envelope)
        await publisher.publish(payload, "sess-a", 0, 0, ordinal, first=ordinal == 0)
    await publisher.wait_acked("sess-a", 0, 0)
    await publisher.close()
    for stream in topology.chunk_streams:
        await conn.nc.jetstream().stream_info(stream)  # the readiness probe
    await check_layout(conn.nc, topology)  # at start
    await _gateway_cools_down(conn, topology)
    await _gateway_watches_keys(conn, topology)
    await _gateway_counts_limits(conn, topology)


async def _gateway_cools_down(conn: Connection, topology: Topology) -> None:
    """A routed gateway's shared cooldowns: watch, cool a deployment, claim its probe, clear."""
    board = Cooldowns(conn.nc, topology.cooldowns_bucket)
    seen: list[object] = []
    watch = await board.watch(seen.append)
    await board.cool("east", reason="429 retry-after 30 s", seconds=30)
    state = await board.state("east")
    assert isinstance(state, Cooling)
    claim = await board.claim_probe("east", revision=state.revision, seconds=5)
    assert claim.won
    await board.clear("east")
    assert [s.deployment for s in await board.states()] == ["east"]
    for _ in range(100):
        if seen and type(seen[-1]).__name__ == "Healthy":
            break
        await asyncio.sleep(0.05)
    # The user's rights are what this checks: the watch delivered, in order, ending at the
    # last state. The bucket keeps one message per deployment, so a state replaced before the
    # watch's consumer delivered it is gone (seen once in CI on a busy machine: Probing); a
    # probe is claimed by compare-and-set, not by what a watch saw, so no outcome changes.
    names = [type(s).__name__ for s in seen]
    assert names in (["Cooling", "Probing", "Healthy"], ["Cooling", "Healthy"]), names
    await watch.stop()


async def _gateway_watches_keys(conn: Connection, topology: Topology) -> None:
    """A gateway's keys: watch the bucket, seed an entry (revision 0), read it back."""
    book = KeysBucket(conn.nc, topology.keys_bucket)
    seen: list[KeyEntry] = []
    watch = await book.watch(seen.append)
    record = KeyRecord(name="seeded", sha256="ab" * 32)
    assert await book.write("key", "seeded", record, expected=0) is not None
    held = await book.entry("key", "seeded")
    assert held is not None
    assert held.record == record
    assert await book.last_revision() == held.revision
    for _ in range(100):
        if seen:
            break
        await asyncio.sleep(0.05)
    assert [e.name for e in seen] == ["seeded"]
    await watch.stop()


async def _gateway_counts_limits(conn: Connection, topology: Topology) -> None:
    """A gateway's limits: compare-and-set a counter, read it back, list the counters."""
    board = Allowances(conn.nc, topology.limits_bucket)
    pool = await board.update("rpm.key.agent.1", lambda p: Pool(p.used + 5, p.holds), ttl_s=60)
    assert pool.used == (await board.read("rpm.key.agent.1")).used == 5
    assert list(await board.pools()) == ["rpm.key.agent.1"]


async def _assembler_consumes(conn: Connection, topology: Topology) -> int:
    got: list[str] = []

    async def handle(msg: ConsumedMessage) -> None:
        got.append(msg.subject)

    consumers = await AssemblerConsumers(conn.nc, topology, handle).start()
    for _ in range(100):
        if len(got) == len(STEP):
            break
        await asyncio.sleep(0.05)
    await conn.nc.jetstream().publish(topology.event_subject("sess-a"), b"{}")
    for session in SESSIONS:  # as the service announces a commit: a core publish, its Msg-Id
        msg_id = f"persisted:{session}"
        await publish_event(conn.nc, topology.event_subject(session), b"{}", msg_id=msg_id)
    assert {topology.events_stream_of(s) for s in SESSIONS} == set(topology.events_streams)
    await consumers.stop()  # acks done; unpins the partition it owned
    claims = StepClaims(conn.nc, topology)  # before recording a step abandoned (issue 48)
    for session in ("sess-a", *SESSIONS):  # with R = 3, every registry bucket
        assert await claims.record(session, 0, 0) is not None, session
    assert await claims.record("sess-a", 9, 0) is None
    # The takeover read of a dead owner's tail: an ordered consumer on the chunk stream.
    tail = await ordered_subscribe(
        conn.nc.jetstream(),
        topology.partition_filter(partition_of("sess-a", topology.partitions)),
        stream=topology.stream_of("sess-a"),
        config=ConsumerConfig(),
    )
    assert (await tail.next_msg(timeout=5)).metadata.sequence.stream == 1
    await tail.unsubscribe()
    return len(got)


async def _telemetry_consumes(conn: Connection, topology: Topology) -> int:
    got: list[str] = []

    async def handle(msg: ConsumedMessage) -> None:
        got.append(msg.subject)
        for session in ("sess-a", *SESSIONS):
            subject = topology.event_subject(session, "started")
            msg_id = f"started:{session}"
            await publish_acked(conn.nc, subject, b"{}", headers={"Nats-Msg-Id": msg_id})
            stream = topology.events_stream_of(session)  # a redelivery's check
            assert await stored_with_msg_id(conn.nc, stream, subject, msg_id)
        await conn.nc.publish(topology.telemetry_live_subject, b"{}")

    await check_layout(conn.nc, topology)  # at start
    stream = topology.stream_of("sess-a")
    consumer = await PullConsumer(conn.nc, stream, "telemetry", handle).start()
    for _ in range(100):
        if got:
            break
        await asyncio.sleep(0.05)
    await conn.nc.jetstream().consumer_info(stream, topology.telemetry_consumer)
    await consumer.stop()
    return len(got)


async def _events_read(conn: Connection, topology: Topology) -> dict[str, int]:
    """Every events stream read as `tokenwire demo` reads the started events."""
    counts = dict.fromkeys(("persisted", "started"), 0)
    for kind in counts:
        for stream in topology.events_streams:
            read = read_range(conn.nc, stream, topology.events_filter(kind), 1, last=None)
            counts[kind] += len([seq async for seq, _ in read])
    return counts


@pytest.mark.slow
@pytest.mark.parametrize(("shards", "registry_shards"), [(1, 1), (3, 3)])
async def test_each_user_may_do_its_job_and_nothing_else(
    tmp_path: Path, shards: int, registry_shards: int
) -> None:
    """The same committed file for every TOKENWIRE_SHARDS (the stream names change with it)
    and for the registry's R = 1 and R = 3 (its bucket names too)."""
    port = free_port()
    node = Node(_single_node_config(tmp_path, port), NodePorts(port, 0, 0), "single")
    with running([node]):
        provision(
            node.url("provisioner"), replicas=1, shards=shards, registry_shards=registry_shards
        )
        topology = Topology(shards=shards, registry_shards=registry_shards)
        users = ("gateway", "assembler", "telemetry", "operator")
        conns = {u: await connect_as(u, node.url(u)) for u in users}
        try:
            await _gateway_publishes(conns["gateway"], topology)
            assert await _assembler_consumes(conns["assembler"], topology) == len(STEP)
            assert await _telemetry_consumes(conns["telemetry"], topology) == 1
            # GET /v1/sessions/{session}/events and `tokenwire replay`: tokenwire.replay
            for user in ("gateway", "operator"):
                events = [e async for e in read_session(conns[user].nc, topology, "sess-a")]
                assert [e.seq for e in events] == [1, 2, 3, 4, 5, 6], user
                assert [e.envelope.chunk for e in events] == STEP, user
            reader = SessionReader(conns["operator"].nc, topology, "sess-a")
            assert [c.stream_seq async for c in reader.replay()] == [1, 2, 3, 4, 5, 6]
            later = SessionReader(conns["operator"].nc, topology, "sess-a", from_seq=4)
            assert [c.stream_seq async for c in later.replay()] == [4, 5, 6]
            assert await _events_read(conns["operator"], topology) == {
                "persisted": 1 + len(SESSIONS),
                "started": 1 + len(SESSIONS),
            }
            # tokenwire status: the deployments held back
            board = Cooldowns(conns["operator"].nc, topology.cooldowns_bucket)
            assert [s.deployment for s in await board.states()] == ["east"]
            # tokenwire keys list / revoke
            book = KeysBucket(conns["operator"].nc, topology.keys_bucket)
            [seeded] = await book.entries()
            assert await book.write("key", "seeded", None, expected=seeded.revision)
            # Everything above ran without a single violation ...
            assert {u: c.violations() for u, c in conns.items()} == {u: [] for u in conns}
            # ... and what each must not do is refused.
            s = topology.stream_of_partition(15)
            for verb in ("DELETE", "UPDATE", "PURGE"):
                await _denied(conns["gateway"], f"$JS.API.STREAM.{verb}.{s}")
            await _denied(conns["gateway"], f"$JS.API.CONSUMER.CREATE.{s}.assembler-p15")
            await _denied(conns["gateway"], f"$JS.API.CONSUMER.DELETE.{s}.assembler-p15")
            await _denied(conns["gateway"], f"$JS.API.CONSUMER.DELETE.{s}.telemetry")
            await _denied(conns["gateway"], f"$JS.API.STREAM.MSG.DELETE.{s}")
            await _denied(conns["assembler"], f"$JS.API.STREAM.PURGE.{s}")
            await _denied(conns["telemetry"], f"$JS.API.CONSUMER.MSG.NEXT.{s}.assembler-p15")
            await _denied(conns["operator"], f"$JS.API.CONSUMER.DELETE.{s}.telemetry")
            await _denied(conns["operator"], f"$JS.API.CONSUMER.DELETE.{s}.assembler-p15")
            await _denied(conns["operator"], "tw.chunks.3.sess-x.first")
        finally:
            for conn in conns.values():
                await close(conn)


@pytest.mark.slow
async def test_the_provisioner_reshards_a_drained_layout_without_violations(
    tmp_path: Path,
) -> None:
    """`docker compose run --rm provision reshard` / the Job with `args: [reshard]`: the
    provisioner's permissions cover the layout check, the drain check, retiring the old
    streams, creating the new ones and spreading their leaders; the services of the new
    layout then start; one of the old layout is refused."""
    port = free_port()
    node = Node(_single_node_config(tmp_path, port), NodePorts(port, 0, 0), "single")
    with running([node]):
        provision(node.url("provisioner"), replicas=1)
        result = run_provision(node.url("provisioner"), 1, shards=3, command=("reshard",))
        assert result.returncode == 0, result.stderr
        assert "K=1 P=16 -> K=3 P=16; retired TOKENWIRE" in result.stdout
        assert "Violation" not in node.log()
        stale = run_provision(node.url("provisioner"), 1, shards=1)
        assert stale.returncode == 2
        assert "another layout" in stale.stderr
        conn = await connect_as("gateway", node.url("gateway"))
        try:
            await check_layout(conn.nc, Topology(shards=3))
            assert conn.violations() == []
        finally:
            await close(conn)


def test_write_node_configs_uses_free_ports_never_the_defaults(tmp_path: Path) -> None:
    configs = write_node_configs(tmp_path)
    ports = {p for _, node_ports in configs for p in vars(node_ports).values()}
    assert len(ports) == 9
    assert not ports & {4222, 6222, 8222}
