"""Every private nats-py member tokenwire uses, checked on live objects of the pinned nats-py
(ADR 0008 lists them, with their guards). An upgrade that renames one fails here, by name,
before anything silently takes a slower or degraded path.

The guards themselves (the public path taken when a member is missing) are tested beside the
code that uses them: tests/broker/test_frames.py, test_replies.py, test_ordered.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from nats.aio.client import Client
from nats.js import api

from tokenwire.broker import Topology, ordered_subscribe
from tokenwire.broker._frames import _PRIVATE_API as FRAME_MEMBERS
from tokenwire.broker._replies import _PRIVATE_API as REPLY_MEMBERS

CLIENT_MEMBERS = {
    "_send_command": "broker/_frames.py: chunk frames appended to the write buffer",
    "_flush_pending": "broker/_frames.py: the flusher kicked as publish() does",
    "_flush_queue": "broker/_frames.py: kicked only when the flusher is idle",
    "_process_msg": "broker/_replies.py: replies (and _bounded.py's reads) before nats-py's Msg",
    "_server_info": "broker/_inspect.py: server name and JetStream flag for status",
    "stats": "broker/_frames.py: out_msgs/out_bytes kept true for frames sent past publish()",
}


def test_the_table_covers_what_the_guards_check() -> None:
    assert set(FRAME_MEMBERS) | set(REPLY_MEMBERS) <= set(CLIENT_MEMBERS)


@pytest.mark.parametrize("member", sorted(CLIENT_MEMBERS))
async def test_a_connected_client_has(nc: Client, member: str) -> None:
    assert hasattr(nc, member), f"nats-py's Client lost {member} ({CLIENT_MEMBERS[member]})"


async def test_server_info_is_the_servers_info(nc: Client) -> None:
    info: dict[str, Any] = nc._server_info
    v = nc.connected_server_version
    assert info["version"] == f"{v.major}.{v.minor}.{v.patch}"
    assert isinstance(nc.stats["out_msgs"], int)


async def test_a_subscription_has_its_sid(nc: Client) -> None:
    sub = await nc.subscribe("_tw.private.sid")
    try:
        assert isinstance(sub._id, int), "Subscription._id (broker/_replies.py: the tap key)"
    finally:
        await sub.unsubscribe()


async def test_an_ordered_subscription_has_its_reset(nc: Client, topology: Topology) -> None:
    config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL)
    sub = await ordered_subscribe(
        nc.jetstream(), topology.partition_filter(0), stream=topology.stream, config=config
    )
    try:
        # broker/_ordered.py renames a recreated ordered consumer through these.
        jsi = sub._sub._jsi
        assert jsi is not None
        assert callable(jsi.reset_ordered_consumer)
        assert hasattr(jsi, "_ccreq")
    finally:
        await sub.unsubscribe()
