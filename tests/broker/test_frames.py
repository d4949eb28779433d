"""FrameWriter against nats-py's own publish: the server delivers the same message."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from nats.aio.msg import Msg

from tokenwire.broker._frames import FrameWriter, hpub_frame

HEADERS = {
    "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    "tracestate": "vendor=a\r\nb",  # CR/LF must not break the frame
    "Nats-Msg-Id": "s-1:0:2:17",
}


async def test_the_pinned_nats_py_has_what_the_frame_writer_uses(nc: Client) -> None:
    """Fails when a nats-py upgrade renamed its internals (the publisher then falls back to
    the public publish, correct but ~15% more CPU per chunk in the gateway)."""
    writer = FrameWriter(nc)
    assert writer.enabled
    assert writer.usable(1024)
    assert not writer.usable(nc.max_payload + 1)


async def test_a_frame_delivers_what_nats_py_publish_delivers(nc: Client) -> None:
    got: list[Msg] = []
    both = asyncio.Event()

    async def collect(msg: Msg) -> None:
        got.append(msg)
        if len(got) == 2:
            both.set()

    await nc.subscribe("frames.test.>", cb=collect)
    payload = b'{"chunk":"\xc3\xa9t\xc3\xa9 \\r\\n"}'
    await nc.publish("frames.test.a", payload, reply="_INBOX.r.1", headers=dict(HEADERS))
    await FrameWriter(nc).publish("frames.test.a", "_INBOX.r.1", HEADERS, payload)
    await asyncio.wait_for(both.wait(), 5)
    public, framed = got
    assert (framed.subject, framed.reply, framed.data) == (public.subject, public.reply, payload)
    assert framed.headers == public.headers
    assert framed.headers is not None
    assert framed.headers["tracestate"] == "vendor=a  b"


def test_frame_layout() -> None:
    """The NATS protocol's HPUB: header bytes (10 + 6 + 2 = 18), then total bytes (18 + 4)."""
    frame = hpub_frame("s.x", "r.1", {"K": "v"}, b"data")
    assert frame == b"HPUB s.x r.1 18 22\r\nNATS/1.0\r\nK: v\r\n\r\ndata\r\n"
