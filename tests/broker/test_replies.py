"""ReplyInbox on a real nats-server: the direct path delivers what nats-py's own path delivers."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from nats.aio.msg import Msg

from tokenwire.broker._replies import ReplyInbox, status_of

Reply = tuple[str, bytes, int | None]


class Collector:
    """Records replies; ``wait(n)`` until ``n`` arrived."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self._changed = asyncio.Event()

    def __call__(self, token: str, data: bytes, status: int | None) -> None:
        self.replies.append((token, data, status))
        self._changed.set()

    async def wait(self, n: int) -> list[Reply]:
        async with asyncio.timeout(5):
            while len(self.replies) < n:
                self._changed.clear()
                await self._changed.wait()
        return self.replies


async def exchange(nc: Client, inbox: ReplyInbox, seen: Collector) -> list[Reply]:
    """A plain reply, a reply with headers, and the server's 503 for a request nobody hears."""
    await nc.publish(inbox.prefix + "7", b'{"seq":1}')
    await nc.publish(inbox.prefix + "8", b"x", headers={"K": "v"})
    await nc.publish("nobody.listens.here", b"", reply=inbox.prefix + "9")
    return sorted(await seen.wait(3))


async def test_the_pinned_nats_py_has_what_the_inbox_uses(nc: Client) -> None:
    """Fails when a nats-py upgrade renamed its internals (replies then take the public
    path: correct, but a Msg, a queue entry and a task step per ack)."""
    assert ReplyInbox(nc, Collector()).direct


async def test_direct_and_public_paths_deliver_the_same(nc: Client) -> None:
    expected = [("7", b'{"seq":1}', None), ("8", b"x", None), ("9", b"", 503)]
    direct_seen, public_seen = Collector(), Collector()
    direct = await ReplyInbox(nc, direct_seen).start()
    public = ReplyInbox(nc, public_seen)
    public.direct = False
    await public.start()
    assert await exchange(nc, direct, direct_seen) == expected
    assert await exchange(nc, public, public_seen) == expected
    await direct.close()
    await public.close()


async def test_other_subscriptions_and_a_failing_handler(nc: Client) -> None:
    """A handler that raises is logged; the connection and other subscriptions go on."""
    got: list[Msg] = []
    other = asyncio.Event()

    async def on_other(msg: Msg) -> None:
        got.append(msg)
        other.set()

    def broken(token: str, data: bytes, status: int | None) -> None:
        raise RuntimeError("handler bug")

    await nc.subscribe("other.subject", cb=on_other)
    inbox = await ReplyInbox(nc, broken).start()
    await nc.publish(inbox.prefix + "1", b"a")
    await nc.publish("other.subject", b"b")
    await asyncio.wait_for(other.wait(), 5)
    assert nc.is_connected
    assert [m.data for m in got] == [b"b"]
    await inbox.close()


async def test_replies_after_close_are_not_delivered(nc: Client) -> None:
    seen = Collector()
    inbox = await ReplyInbox(nc, seen).start()
    await nc.publish(inbox.prefix + "1", b"a")
    await seen.wait(1)
    await inbox.close()
    await nc.publish(inbox.prefix + "2", b"b")
    await nc.flush()
    await asyncio.sleep(0.05)
    assert seen.replies == [("1", b"a", None)]


def test_status_of_raw_header_blocks() -> None:
    assert status_of(None) is None
    assert status_of(b"NATS/1.0 503\r\n\r\n") == 503
    assert status_of(b"NATS/1.0 408 Request Timeout\r\n\r\n") == 408
    assert status_of(b"NATS/1.0\r\nNats-Msg-Id: x\r\n\r\n") is None
