"""A pull consumer's deliveries taken raw from nats-py's parser (``_replies.tap``), header
blocks kept as bytes until read, acks written as frames: the same messages, headers, order
and settlement as nats-py's ``Msg`` path, on the real server."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nats.aio.client import Client

from tests.broker.test_consumer import eventually
from tests.broker.test_consumer_modes import MANUAL, settles_to
from tokenwire.broker import (
    ChunkPublisher,
    ConsumedMessage,
    Topology,
    ack_many,
    nak_many,
    partition_consumer,
    partition_of,
)
from tokenwire.broker import _consumer as consumer_module
from tokenwire.broker._frames import header_block
from tokenwire.broker._replies import header_fields, header_value

TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
NAME = st.text(st.sampled_from("abcXYZ-_019"), min_size=1, max_size=12)
VALUE = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=30)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(NAME, VALUE, max_size=6))
async def test_header_blocks_parse_as_nats_py_parses_them(fields: dict[str, str]) -> None:
    block = header_block(fields)
    oracle = await Client()._process_headers(block) or {}  # nats-py's own parser
    assert header_fields(block) == oracle
    for name, value in oracle.items():
        assert header_value(block, name.encode()) == value


def test_status_lines_and_missing_blocks_have_no_fields() -> None:
    assert header_fields(None) == {}
    assert header_fields(b"NATS/1.0 408 Request Timeout\r\n\r\n") == {}
    assert header_value(b"NATS/1.0\r\nA: 1\r\n\r\n", b"B") is None


async def fill(nc: Client, t: Topology, count: int) -> list[str]:
    """``count`` chunks to partition 0, the first of each step with trace headers."""
    sessions = [s for s in (f"raw-{i}" for i in range(400)) if partition_of(s, t.partitions) == 0]
    publisher = await ChunkPublisher(nc, t).start()
    for k in range(count):
        ordinal = k // 4
        headers = TRACE if ordinal == 0 else None
        payload = b"c%d" % k
        await publisher.publish(
            payload, sessions[k % 4], 0, 0, ordinal, first=ordinal == 0, headers=headers
        )
    await publisher.flush(10)
    await publisher.close()
    await settles_to(nc, t, 0, (count, 0))
    return sessions[:4]


async def take_all(nc: Client, t: Topology, count: int) -> list[ConsumedMessage]:
    """Every message of partition 0, held unsettled (manual mode)."""
    held: list[ConsumedMessage] = []

    async def keep(cm: ConsumedMessage) -> None:
        held.append(cm)

    consumer = await partition_consumer(nc, t, 0, keep, MANUAL).start()
    try:
        await eventually(lambda: len(held) == count)
    finally:
        await consumer.stop(release=False)
    return held


def seen(batch: list[ConsumedMessage]) -> list[tuple[int, str, bytes, dict[str, str]]]:
    """What each delivery carried, by stream sequence (redeliveries come in any order), less
    the pin id (a new consumer client: a new pin)."""
    for cm in batch:
        assert cm.pin_id == cm.headers["Nats-Pin-Id"]  # grouped: every delivery names its pin
    fields = [(cm.stream_seq, cm.subject, cm.data, dict(cm.headers)) for cm in batch]
    for _, _, _, headers in fields:
        del headers["Nats-Pin-Id"]
    return sorted(fields)


async def test_raw_and_msg_paths_deliver_the_same_and_acks_settle_on_the_server(
    nc: Client, topology: Topology, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = 24
    await fill(nc, topology, count)
    raw = await take_all(nc, topology, count)
    assert raw[0]._headers is None  # the header block is not parsed until read
    assert await nak_many(raw) == 0  # handed back at once (frames): delivered again
    monkeypatch.setattr(consumer_module, "tap", lambda *args: False)  # nats-py's Msg path
    public = await take_all(nc, topology, count)
    assert seen(raw) == seen(public)
    assert [cm.num_delivered for cm in public] == [2] * count
    assert [cm.data for cm in raw] == [b"c%d" % k for k in range(count)]  # first: in order
    firsts = [cm for cm in raw if "traceparent" in cm.headers]
    assert len(firsts) == 4
    assert all(cm.headers["traceparent"] == TRACE["traceparent"] for cm in firsts)
    assert all(set(cm.headers) == {"Nats-Msg-Id", "Nats-Pin-Id"} for cm in raw if cm not in firsts)
    assert await ack_many(public) == 0
    assert all(cm.resolved for cm in public)
    await settles_to(nc, topology, 0, (0, 0))
