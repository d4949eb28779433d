"""The operations the services use beside the publisher and the consumers (consumer state,
unpin, dead-lettering, events and acknowledged writes, reads by subject, range reads, the
connected server), against the real server; and the one translation of nats-py's errors.

Expected values come from nats-py's own API on the same server (``js.stream_info``,
``js.get_msg``, ``js.consumer_info``), not from the operations under test."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from nats.aio.client import Client
from nats.errors import ConnectionClosedError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from tests.broker.test_consumer import eventually
from tests.broker.test_consumer_modes import MANUAL, fill_partition
from tests.fixtures.broker import close_client
from tokenwire.broker import (
    BrokerError,
    BrokerUnavailable,
    ConsumedMessage,
    PullConsumer,
    RequestFailed,
    Topology,
    connect,
    consumer_state,
    dead_letter,
    last_by_subject,
    partition_consumer,
    publish_acked,
    publish_event,
    read_range,
    server_info,
    stored_with_msg_id,
    stream_info,
    stream_subjects,
    unpin,
)
from tokenwire.broker._translate import translated


async def _settles(nc: Client, topology: Topology) -> int:
    """Partition 0's unacknowledged count once it stops falling (acks are asynchronous)."""
    name = topology.assembler_consumer(0)
    for _ in range(100):
        state = await consumer_state(nc, topology.stream, name)
        if state.num_ack_pending == 0:
            return 0
        await asyncio.sleep(0.05)
    return state.num_ack_pending


NO_CONSUMER = 10014  # JSConsumerNotFoundErr
NO_STREAM = 10059  # JSStreamNotFoundErr


@contextlib.asynccontextmanager
async def holding(
    nc: Client, topology: Topology, count: int
) -> AsyncIterator[tuple[PullConsumer, list[ConsumedMessage]]]:
    """Partition 0 filled with ``count`` messages, delivered to a manual-ack consumer that
    holds them unsettled (yielded once all arrived); stopped without releasing its pin."""
    await fill_partition(nc, topology, count)
    held: list[ConsumedMessage] = []

    async def keep(batch: list[ConsumedMessage]) -> None:
        held.extend(batch)

    consumer = partition_consumer(nc, topology, 0, settings=MANUAL, batch_handler=keep)
    await consumer.start()
    try:
        await eventually(lambda: consumer.pin_id is not None and len(held) == count)
        yield consumer, held
    finally:
        await consumer.stop(release=False)


async def test_consumer_state_matches_nats_py_consumer_info(nc: Client, topology: Topology) -> None:
    await fill_partition(nc, topology, 12)
    name = topology.assembler_consumer(0)
    state = await consumer_state(nc, topology.stream, name)
    info = await nc.jetstream().consumer_info(topology.stream, name)
    assert (state.num_pending, state.num_ack_pending) == (info.num_pending, info.num_ack_pending)
    assert state.num_pending == 12
    assert state.ack_floor.stream_seq == 0


async def test_a_missing_consumer_or_stream_is_a_request_failed_with_the_server_code(
    nc: Client, topology: Topology
) -> None:
    with pytest.raises(RequestFailed) as caught:
        await consumer_state(nc, topology.stream, "no-such-consumer")
    assert caught.value.code == NO_CONSUMER
    with pytest.raises(RequestFailed) as caught:
        await stream_info(nc, "NO_SUCH_STREAM")
    assert caught.value.code == NO_STREAM


async def test_unpin_moves_the_pin_off_its_holder(nc: Client, topology: Topology) -> None:
    async with holding(nc, topology, 4) as (consumer, _):
        name, group = topology.assembler_consumer(0), topology.assembler_group
        before = await consumer_state(nc, topology.stream, name)
        assert before.pinned(group) == consumer.pin_id
        await unpin(nc, topology.stream, name, group)
        after = await consumer_state(nc, topology.stream, name)
        assert after.pinned(group) != consumer.pin_id


async def test_dead_letter_copies_once_with_one_header_set_then_terminates(
    nc: Client, topology: Topology
) -> None:
    async with holding(nc, topology, 2) as (_, held):
        cm = held[0]
        dlq = topology.dlq_subject("assembler")
        stream = topology.stream
        assert await dead_letter(nc, dlq, cm, stream=stream, reason="poison", detail="why")
        # A second copy of the same message (a redelivery dead-lettered again) is deduped.
        assert await dead_letter(nc, dlq, cm, stream=stream, reason="poison", detail="again")
        js = nc.jetstream()
        assert (await js.stream_info(topology.dlq_stream)).state.messages == 1
        copy = await js.get_msg(topology.dlq_stream, 1)
        assert copy.data == cm.data
        assert copy.headers == {
            "Nats-Msg-Id": f"dlq:{stream}:{cm.stream_seq}",
            "Tokenwire-Reason": "poison",
            "Tokenwire-Detail": "why",
            "Tokenwire-Subject": cm.subject,
            "Tokenwire-Stream": stream,
            "Tokenwire-Stream-Seq": str(cm.stream_seq),
        }
        assert cm.resolved  # terminated
        await held[1].ack()
        assert await _settles(nc, topology) == 0


async def test_an_unacknowledged_dead_letter_leaves_the_message_unsettled(
    nc: Client, topology: Topology
) -> None:
    async with holding(nc, topology, 1) as (_, held):
        nowhere = f"{topology.prefix}.nobody.listens"  # no stream: no ack, no responders
        assert not await dead_letter(nc, nowhere, held[0], stream=topology.stream, reason="x")
        assert not held[0].resolved


async def test_acked_publish_reports_duplicates_and_reads_by_subject_find_them(
    nc: Client, topology: Topology
) -> None:
    subject = topology.event_subject("sess-1", "started")
    headers = {"Nats-Msg-Id": "started:sess-1:0:0"}
    assert not await publish_acked(nc, subject, b"one", headers=headers)
    assert await publish_acked(nc, subject, b"one", headers=headers)  # deduped
    assert not await publish_acked(nc, subject, b"two", headers={"Nats-Msg-Id": "other"})
    events = topology.events_stream
    assert await stored_with_msg_id(nc, events, subject, "started:sess-1:0:0")
    assert await stored_with_msg_id(nc, events, subject, "other")
    assert not await stored_with_msg_id(nc, events, subject, "never-sent")
    assert await stream_subjects(nc, events, f"{topology.prefix}.events.>") == {subject: 2}


async def test_last_by_subject_reads_a_bucket_s_newest_value(
    nc: Client, topology: Topology
) -> None:
    bucket = topology.members_bucket
    key = f"$KV.{bucket}.member-1"
    await publish_acked(nc, key, b"first")
    await publish_acked(nc, key, b"", headers={"KV-Operation": "DEL"})
    newest = await last_by_subject(nc, f"KV_{bucket}", key)
    assert newest is not None
    assert (newest.data, newest.headers.get("KV-Operation")) == (b"", "DEL")
    expected = await nc.jetstream().get_last_msg(f"KV_{bucket}", key)
    assert newest.data == (expected.data or b"")  # nats-py says None for empty
    assert await last_by_subject(nc, f"KV_{bucket}", f"$KV.{bucket}.member-2") is None


async def test_a_core_event_is_stored_once_per_msg_id(nc: Client, topology: Topology) -> None:
    subject = topology.event_subject("sess-3", "persisted")
    for _ in range(3):
        await publish_event(nc, subject, b"p", msg_id="persisted:sess-3:0:0")
    await nc.flush()
    js = nc.jetstream()
    for _ in range(100):  # core publishes: stored shortly after the flush
        info = await js.stream_info(topology.events_stream, subjects_filter=subject)
        if info.state.messages:
            break
        await asyncio.sleep(0.05)
    await publish_acked(nc, subject, b"p", headers={"Nats-Msg-Id": "persisted:sess-3:0:0"})
    info = await js.stream_info(topology.events_stream, subjects_filter=subject)
    assert (info.state.subjects or {}) == {subject: 1}


async def test_read_range_reads_exactly_the_range_and_ends_an_idle_read_with_an_error(
    nc: Client, topology: Topology
) -> None:
    subject = f"{topology.prefix}.events.range.started"
    js = nc.jetstream()
    seqs = [(await js.publish(subject, f"m{i}".encode())).seq for i in range(6)]
    got = [
        s async for s, _ in read_range(nc, topology.events_stream, subject, seqs[1], last=seqs[3])
    ]
    assert got == seqs[1:4]
    to_end = [
        d async for _, d in read_range(nc, topology.events_stream, subject, seqs[4], last=None)
    ]
    assert to_end == [b"m4", b"m5"]
    with pytest.raises(RequestFailed, match="no message within"):
        async for _ in read_range(
            nc, topology.events_stream, subject, seqs[-1] + 1, last=None, idle_s=0.5
        ):
            pass


async def test_server_info_names_the_connected_server(nc: Client) -> None:
    info = server_info(nc)
    v = nc.connected_server_version
    assert info.version == f"{v.major}.{v.minor}.{v.patch}"
    assert info.jetstream
    assert info.max_payload == nc.max_payload > 0
    assert nc.connected_url is not None
    assert info.url == nc.connected_url.geturl()


@pytest.mark.parametrize(
    ("raised", "expected"),
    [
        (NoRespondersError(), RequestFailed),
        (NatsTimeoutError(), RequestFailed),
        (TimeoutError(), RequestFailed),
        (ConnectionClosedError(), BrokerUnavailable),
    ],
    ids=lambda v: getattr(v, "__name__", type(v).__name__),
)
async def test_nats_py_errors_leave_the_boundary_translated(
    nc: Client, raised: Exception, expected: type[BrokerError]
) -> None:
    with pytest.raises(expected) as caught, translated(nc, "what"):
        raise raised
    assert caught.value.__cause__ is raised


async def test_a_closed_connection_is_broker_unavailable(nats_url: str, topology: Topology) -> None:
    client = await connect(nats_url, name="tokenwire-closed")
    await close_client(client)
    with pytest.raises(BrokerUnavailable):
        await publish_event(client, topology.event_subject("s", "persisted"), b"x", msg_id="m")
    with pytest.raises(BrokerError):
        await consumer_state(client, topology.stream, topology.assembler_consumer(0))
