"""The publisher never crosses the connected server's max_payload (headers counted).

Against the real nats-server of the fixtures, which runs with the default 1 MiB
``max_payload``. Before the check, a payload under the limit whose headers took it over made
the server close the connection and nats-py close the client for good.
"""

from __future__ import annotations

import pytest
from nats.aio.client import Client

from tokenwire.broker import ChunkPublisher, PayloadTooLarge, SessionReader, Topology, connect
from tokenwire.broker._frames import header_size, hpub_frame

TRACE = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}


def test_header_size_is_the_header_block_hpub_writes() -> None:
    headers = {**TRACE, "Nats-Msg-Id": "s:0:0:1", "x-note": "caf\u00e9"}
    frame = hpub_frame("s.x", "r.1", headers, b"payload")
    header_len = int(frame.split(b"\r\n", 1)[0].split(b" ")[3])
    assert header_size(headers) == header_len


async def test_payload_under_the_limit_but_over_it_with_headers_is_refused_and_the_client_lives(
    nats_url: str, topology: Topology
) -> None:
    nc: Client = await connect(nats_url)
    publisher = await ChunkPublisher(nc, topology).start()
    try:
        limit = nc.max_payload
        assert limit == 1024 * 1024  # the server's default
        mid_headers = {**TRACE, "Nats-Msg-Id": "big:0:0:0"}
        payload = b"x" * (limit - header_size(mid_headers) + 1)  # over by one byte, with headers
        assert len(payload) < limit  # nats-py's own check (the payload alone) lets it through
        with pytest.raises(PayloadTooLarge) as info:
            await publisher.publish(payload, "big", 0, 0, 0, first=True, headers=TRACE)
        assert info.value.limit == limit
        assert info.value.size == limit + 1
        assert info.value.room == len(payload) - 1

        # The largest message that fits is published and acked on the same, live connection.
        fitting = payload[: info.value.room]
        await publisher.publish(fitting, "big", 0, 0, 0, first=True, headers=TRACE)
        await publisher.wait_acked("big", 0, 0, timeout_s=10)
        assert nc.is_connected
        stored = [c.payload async for c in SessionReader(nc, topology, "big").replay()]
        assert stored == [fitting]
    finally:
        await publisher.close()
        await nc.close()
