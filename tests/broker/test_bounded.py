"""BoundedRead against the real server: the window holds, a stalled reader pulls nothing, and
gaps (a lost delivery, a deleted or expired consumer) are read again from the next sequence."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client

from tokenwire.broker import ChunkPublisher, ReadWindow, Topology
from tokenwire.broker._bounded import BoundedRead, Delivery


async def _publish(nc: Client, topology: Topology, session: str, payloads: list[bytes]) -> None:
    publisher = await ChunkPublisher(nc, topology).start()
    for k, payload in enumerate(payloads):
        await publisher.publish(payload, session, 0, 0, k, first=k == 0)
    await publisher.wait_acked(session, 0, 0)
    await publisher.close()


def _read(nc: Client, topology: Topology, session: str, window: ReadWindow) -> BoundedRead:
    return BoundedRead(
        nc, topology.stream, topology.session_filter(session), 1, window=window, heartbeat_s=0.5
    )


async def _all(read: BoundedRead, n: int) -> list[Delivery]:
    got: list[Delivery] = []
    while len(got) < n:
        batch = await read.take(10.0)
        assert batch, f"stalled after {len(got)} of {n}"
        got += batch
    return got


async def _delivered(nc: Client, read: BoundedRead, topology: Topology) -> int:
    """What the server says it delivered to the read's consumer (the oracle of the bound)."""
    info = await nc.jetstream().consumer_info(topology.stream, read._name.decode())
    assert info.delivered is not None
    return int(info.delivered.consumer_seq or 0)


async def _settled(nc: Client, read: BoundedRead, topology: Topology) -> int:
    """The server's delivered count once it stopped moving (bounded: 5 s)."""
    last = -1
    for _ in range(50):
        now = await _delivered(nc, read, topology)
        if now == last:
            return now
        last = now
        await asyncio.sleep(0.1)
    raise AssertionError("the server kept delivering to a stalled reader")


async def test_a_stalled_reader_holds_at_most_its_window_of_messages(
    nc: Client, topology: Topology
) -> None:
    payloads = [b"%06d" % k for k in range(3000)]
    await _publish(nc, topology, "stall", payloads)
    read = _read(nc, topology, "stall", ReadWindow(messages=64))
    assert await read.open() == 3000
    try:
        taken = await read.take(10.0)
        delivered = await _settled(nc, read, topology)  # the caller stopped taking
        assert len(taken) <= 64
        assert delivered - len(taken) <= 64  # requested and not handed over: the window
        rest = await _all(read, 3000 - len(taken))
        assert [d[1] for d in taken + rest] == payloads  # every message once, in order
        assert [d[0] for d in taken + rest] == sorted({d[0] for d in taken + rest})
    finally:
        await read.close()


async def test_the_window_bounds_bytes_and_a_larger_message_comes_alone(
    nc: Client, topology: Topology
) -> None:
    payloads = [bytes([65 + k % 26]) * 10_000 for k in range(40)]
    payloads[7] = b"x" * 50_000  # larger than the whole window
    await _publish(nc, topology, "big", payloads)
    read = _read(nc, topology, "big", ReadWindow(messages=1000, bytes=32 * 1024))
    await read.open()
    try:
        taken = await read.take(10.0)
        delivered = await _settled(nc, read, topology)
        assert (delivered - len(taken)) * 10_000 <= 32 * 1024
        rest = await _all(read, 40 - len(taken))
        assert [d[1] for d in taken + rest] == payloads
    finally:
        await read.close()


async def test_a_consumer_deleted_under_a_reader_is_recreated_from_the_next_seq(
    nc: Client, topology: Topology
) -> None:
    payloads = [b"%04d" % k for k in range(500)]
    await _publish(nc, topology, "gone", payloads)
    read = _read(nc, topology, "gone", ReadWindow(messages=32))
    await read.open()
    try:
        first = await read.take(10.0)
        await nc.jetstream().delete_consumer(topology.stream, read._name.decode())
        rest = await _all(read, 500 - len(first))
        assert [d[1] for d in first + rest] == payloads
        assert read.recreated >= 1
    finally:
        await read.close()


async def test_a_lost_delivery_is_a_gap_read_again_in_order(nc: Client, topology: Topology) -> None:
    payloads = [b"%04d" % k for k in range(300)]
    await _publish(nc, topology, "gap", payloads)

    class LosesOne(BoundedRead):
        lost = False

        def _on_delivery(self, subject, reply, data, hdr):
            if data == b"0100" and not self.lost:
                self.lost = True  # as if the connection dropped it
                return
            super()._on_delivery(subject, reply, data, hdr)

    read = LosesOne(
        nc,
        topology.stream,
        topology.session_filter("gap"),
        1,
        window=ReadWindow(messages=16),
        heartbeat_s=0.5,
    )
    await read.open()
    try:
        got = await _all(read, 300)
        assert [d[1] for d in got] == payloads
        assert read.lost
        assert read.recreated == 1
    finally:
        await read.close()


async def test_a_reader_back_after_its_consumer_expired_reads_on(
    nc: Client, topology: Topology
) -> None:
    """Stalled past ``inactive_s``, the server deletes its consumer: nothing is kept for it;
    when it takes again it reads on from the next seq."""
    payloads = [b"%04d" % k for k in range(200)]
    await _publish(nc, topology, "idle", payloads)
    read = BoundedRead(
        nc,
        topology.stream,
        topology.session_filter("idle"),
        1,
        window=ReadWindow(messages=16),
        heartbeat_s=0.2,
        inactive_s=0.5,
    )
    await read.open()
    try:
        first = await read.take(10.0)
        name = read._name.decode()
        for _ in range(100):  # the server's inactive threshold, bounded at 10 s
            names = [c.name async for c in _consumers(nc, topology)]
            if name not in names:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the idle consumer was never deleted")
        rest = await _all(read, 200 - len(first))
        assert [d[1] for d in first + rest] == payloads
    finally:
        await read.close()


async def _consumers(nc: Client, topology: Topology):
    for info in await nc.jetstream().consumers_info(topology.stream):
        yield info


async def test_without_the_tap_nats_pys_msg_path_delivers_the_same(
    nc: Client, topology: Topology, monkeypatch
) -> None:
    """ADR 0008's guard: when nats-py lacks what the tap uses, the read takes the ``Msg`` path
    with the same handlers; the same seqs, payloads, subjects and headers come out."""
    from tokenwire.broker import _bounded
    from tokenwire.broker._replies import header_fields

    payloads = [b"%04d" % k for k in range(120)]
    await _publish(nc, topology, "paths", payloads)

    async def read_all() -> list[tuple[int, bytes, bytes, dict[str, str], int]]:
        read = _read(nc, topology, "paths", ReadWindow(messages=32))
        await read.open()
        try:
            got = await _all(read, 120)
        finally:
            await read.close()
        return [(s, p, subj, header_fields(h), pend) for s, p, subj, h, pend in got]

    tapped = await read_all()
    monkeypatch.setattr(_bounded, "tap", lambda *args: False)
    untapped = await read_all()
    assert untapped == tapped
    assert [d[1] for d in tapped] == payloads
    assert tapped[0][3]["Nats-Msg-Id"] == "paths:0:0:0"
    assert [d[4] for d in tapped][-1] == 0
