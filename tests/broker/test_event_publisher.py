"""``EventPublisher`` on a real nats-server: an event published while its stream cannot take
it (no stream yet, as in an election) is stored once it can, a retried Msg-Id is stored once,
the in-flight bound makes the caller wait instead of dropping, and an event the broker never
takes is given up after its deadline and reported."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from nats.aio.client import Client

from tests.fixtures.broker import drop_topology, fresh_topology
from tokenwire.broker import EventPublisher, ensure_topology
from tokenwire.broker._provision import ensure_stream, events_stream_config

BOUND_S = 20.0


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    async def wait() -> None:
        while not await check():  # noqa: ASYNC110 - polling state owned by other tasks
            await asyncio.sleep(0.05)

    try:
        await asyncio.wait_for(wait(), BOUND_S)
    except TimeoutError:
        raise AssertionError(f"not within {BOUND_S} s: {what}") from None


async def test_an_event_waits_out_a_missing_stream_and_is_stored_once(nc: Client) -> None:
    t = fresh_topology()
    given_up: list[int] = []
    events = EventPublisher(nc, on_given_up=given_up.append)
    subject = t.event_subject("sess-1")
    try:
        await events.publish(subject, b'{"n":1}', "persisted:sess-1:0:0")
        await events.publish(subject, b'{"n":1}', "persisted:sess-1:0:0")  # a re-announcement
        assert events.pending == 2  # nothing takes them yet: no stream captures the subject
        await ensure_stream(nc, events_stream_config(t, 0))  # the stream is back

        async def stored_and_settled() -> bool:
            info = await nc.jetstream().stream_info(t.events_stream)
            return events.pending == 0 and info.state.messages >= 1

        await _until(stored_and_settled, "both tries acknowledged")
        info = await nc.jetstream().stream_info(t.events_stream, subjects_filter=">")
        assert info.state.subjects == {subject: 1}  # stored once: the Msg-Id
        assert given_up == []
        assert await events.close(1.0) == 0
    finally:
        await drop_topology(nc, t)


async def test_the_bound_makes_the_caller_wait_and_close_gives_up_the_rest(nc: Client) -> None:
    t = fresh_topology()  # never provisioned: no event is ever acknowledged
    given_up: list[int] = []
    events = EventPublisher(nc, max_pending=2, on_given_up=given_up.append)
    await events.publish(t.event_subject("a"), b"{}", "a")
    await events.publish(t.event_subject("b"), b"{}", "b")
    third = asyncio.create_task(events.publish(t.event_subject("c"), b"{}", "c"))
    await asyncio.sleep(0)  # let it try for a slot
    done, _ = await asyncio.wait({third}, timeout=0.5)
    assert not done  # waiting for a slot, not dropped and not in flight
    assert events.pending == 2
    assert await events.close(0.1) == 2  # the two in flight, given up at shutdown
    await asyncio.wait_for(third, BOUND_S)  # a slot freed: the third is in flight now
    assert events.pending == 1
    assert await events.close(0.1) == 1
    assert given_up == [2, 1]


async def test_an_event_never_taken_is_given_up_after_its_deadline(nc: Client) -> None:
    t = fresh_topology()
    given_up: list[int] = []
    events = EventPublisher(nc, retry_for_s=0.3, ack_timeout_s=0.1, on_given_up=given_up.append)
    await events.publish(t.event_subject("a"), b"{}", "a")

    async def settled() -> bool:
        return events.pending == 0

    await _until(settled, "the event given up")
    assert given_up == [1]
    # and with the stream there, a publisher's event is stored (the same path, succeeding)
    await ensure_topology(nc, t)
    try:
        await events.publish(t.event_subject("a"), b"{}", "a2")
        await _until(settled, "the event stored")
        assert (await nc.jetstream().stream_info(t.events_stream)).state.messages == 1
        assert given_up == [1]
    finally:
        await drop_topology(nc, t)


@pytest.mark.parametrize("pending", [1, 3])
async def test_pending_counts_events_until_acknowledged(nc: Client, pending: int) -> None:
    t = fresh_topology()
    await ensure_topology(nc, t)
    events = EventPublisher(nc)
    try:
        for i in range(pending):
            await events.publish(t.event_subject(f"s{i}"), b"{}", f"id{i}")
        assert events.pending == pending  # handed over, not yet acknowledged

        async def settled() -> bool:
            return events.pending == 0

        await _until(settled, "every event acknowledged")
        assert (await nc.jetstream().stream_info(t.events_stream)).state.messages == pending
    finally:
        await drop_topology(nc, t)
