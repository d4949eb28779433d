"""``KvWriter``: conditional writes to a JetStream KV bucket, sent at once, acked by callback.

A write is a core publish to ``$KV.<bucket>.<key>`` with ``Nats-Expected-Last-Subject-Sequence``
(0: the key must not exist) and a reply subject under one inbox subscription, the KV protocol
nats-py's ``KeyValue.create``/``update`` speak too (ADR 8 of nats-architecture-and-design),
without their event-loop turns per write (ADR 0008 gives what they cost a step's time to
first chunk): :meth:`KvWriter.put_if` sends before it returns and the ack resolves its future
in the subscription's callback. While the connection is up, a write is an ``HPUB`` frame
(``_frames.FrameWriter``). A future nobody awaits any more is cancelled and forgotten; a
closed connection fails the write at once.
"""

from __future__ import annotations

import asyncio

import msgspec
from nats.aio.client import Client
from nats.errors import Error as NatsError

from tokenwire.broker._errors import RequestFailed, StepRegistryError
from tokenwire.broker._frames import FrameWriter, message_size
from tokenwire.broker._puback import puback_decoder
from tokenwire.broker._replies import ReplyInbox
from tokenwire.broker._translate import translated

_WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code when the key's last revision is not the expected one."""
EXPECTED_LAST = "Nats-Expected-Last-Subject-Sequence"
"""The header a conditional write names the key's expected revision in (0: none yet)."""


async def put_checked(
    nc: Client, subject: str, value: bytes, *, headers: dict[str, str], timeout_s: float, what: str
) -> int | None:
    """One request-reply write of a KV entry (bounded by ``timeout_s``): its revision, None
    when the expected revision did not hold; :class:`RequestFailed` naming ``what`` for any
    other refusal (the broker's own errors translated as everywhere in this package)."""
    with translated(nc, what):
        reply = await nc.request(subject, value, timeout_s, headers=headers or None)
        ack = puback_decoder.decode(reply.data)
    if ack.error is None:
        return ack.seq
    if ack.error.err_code == _WRONG_LAST_SEQUENCE:
        return None
    raise RequestFailed(what, ack.error.description, ack.error.err_code)


class KvWriter:
    """Compare-and-set writes to one bucket over one connection.

    ::

        writer = await KvWriter(nc, "steps").start()
        revision = await writer.put_if("s-42", b"...", last=7)   # None: it was not at 7
    """

    def __init__(self, nc: Client, bucket: str) -> None:
        self._nc = nc
        self.bucket = bucket
        self._subject = f"$KV.{bucket}."
        self._prefix = ""
        self._serial = 0
        self._waiting: dict[str, asyncio.Future[int | None]] = {}
        self._inbox = ReplyInbox(nc, self._on_reply)
        self._frames = FrameWriter(nc)

    async def start(self) -> KvWriter:
        """Subscribe the reply inbox; returns self."""
        self._prefix = (await self._inbox.start()).prefix
        return self

    async def close(self) -> None:
        """Unsubscribe; writes still waiting fail."""
        for future in list(self._waiting.values()):
            future.cancel()
        await self._inbox.close()

    async def put_if(self, key: str, value: bytes, last: int) -> asyncio.Future[int | None]:
        """Send the write now: ``value`` under ``key`` if the key's revision is ``last``.

        The future resolves to the new revision, or ``None`` when the key was not at ``last``;
        :class:`StepRegistryError` for any other failure. Await it with a bound: cancelling
        it (a timeout does) forgets the write's ack.
        """
        self._serial += 1
        token = str(self._serial)
        future: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        self._waiting[token] = future
        future.add_done_callback(lambda _: self._waiting.pop(token, None))
        subject, reply = self._subject + key, self._prefix + token
        headers = {EXPECTED_LAST: str(last)}
        try:
            if self._frames.usable(message_size(headers, len(value))):
                await self._frames.publish(subject, reply, headers, value)  # ADR 0008
            else:
                await self._nc.publish(subject, value, reply=reply, headers=headers)
        except NatsError as exc:
            future.cancel()
            raise StepRegistryError(f"write {key}: {exc!r}") from exc
        return future

    def _on_reply(self, token: str, data: bytes, status: int | None) -> None:
        future = self._waiting.get(token)
        if future is None or future.done():
            return  # an ack after its waiter gave up
        if status is not None:  # 503: no responders (the bucket's stream is not there)
            future.set_exception(StepRegistryError(f"write to {self._subject}: status {status}"))
            return
        try:
            ack = puback_decoder.decode(data)
        except msgspec.DecodeError as exc:
            future.set_exception(StepRegistryError(f"undecodable KV ack: {exc}"))
            return
        if ack.error is None:
            future.set_result(ack.seq)
        elif ack.error.err_code == _WRONG_LAST_SEQUENCE:
            future.set_result(None)
        else:
            future.set_exception(StepRegistryError(f"KV write: {ack.error.description}"))
