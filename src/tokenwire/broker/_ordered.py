"""Ordered consumers by name: the create form least privilege can allow.

JetStream's unnamed create (``$JS.API.CONSUMER.CREATE.<stream>``) takes the consumer's name
from the request body, so a user allowed to create ephemerals that way can also *update* any
durable consumer by naming it (``action: update``). The named form puts the name and the
filter into the subject (``$JS.API.CONSUMER.CREATE.<stream>.<name>.<filter>``), which the
server's subject permissions can check: readers are allowed ``<stream>.*.<filter pattern>``
and denied ``<stream>.<durable>.>`` for every durable (deploy/nats/accounts.conf).

nats-py's ordered consumer recreates itself on a gap with the config it was created with; a
reused name would collide with the consumer it replaces (still alive until its inactive
threshold), so each recreate gets a fresh name.

:func:`read_range` reads a bounded range of one subject with such a consumer (the assembler's
read-back of what a partition's previous owner held).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.js import JetStreamContext, api

from tokenwire.broker._errors import RequestFailed
from tokenwire.broker._translate import translated

READER_NAME_PREFIX = "rd"


def reader_name() -> str:
    """A fresh consumer name for one ordered read (never a durable's name)."""
    return f"{READER_NAME_PREFIX}{uuid.uuid4().hex[:20]}"


async def ordered_subscribe(
    js: JetStreamContext, subject: str, *, stream: str, config: api.ConsumerConfig, **kwargs: Any
) -> JetStreamContext.PushSubscription:
    """``js.subscribe(subject, ordered_consumer=True)`` with a named consumer (see module)."""
    config.name = reader_name()
    sub = await js.subscribe(subject, stream=stream, ordered_consumer=True, config=config, **kwargs)
    _rename_on_reset(sub)
    return sub


def _rename_on_reset(sub: JetStreamContext.PushSubscription) -> None:
    jsi = getattr(getattr(sub, "_sub", None), "_jsi", None)
    if jsi is None or not hasattr(jsi, "reset_ordered_consumer"):
        raise TypeError("nats-py's ordered consumer changed: no _sub._jsi.reset_ordered_consumer")
    reset = jsi.reset_ordered_consumer

    async def reset_with_fresh_name(sseq: int | None) -> bool:
        jsi._ccreq.name = reader_name()
        return bool(await reset(sseq))

    jsi.reset_ordered_consumer = reset_with_fresh_name


async def read_range(
    nc: Client, stream: str, subject: str, first: int, *, last: int | None, idle_s: float = 2.0
) -> AsyncIterator[tuple[int, bytes]]:
    """``(stream_seq, payload)`` of the messages on ``subject`` with ``first <= seq <= last``
    (``last`` None: up to the end of the stream as the read finds it).

    An ordered consumer from ``first``; stops at ``last`` or at the end of the stream.
    Raises RequestFailed after ``idle_s`` without a message (bounded: a slow or failing
    stream ends the read with an error, never silently short, and it never hangs).
    """
    what = f"read of {subject} from seq {first}"
    config = api.ConsumerConfig(
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=first
    )
    with translated(nc, what):
        sub = await ordered_subscribe(nc.jetstream(), subject, stream=stream, config=config)
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=idle_s)
            except TimeoutError:
                raise RequestFailed(what, f"no message within {idle_s} s") from None
            seq = msg.metadata.sequence.stream
            if last is not None and seq > last:
                return
            yield seq, msg.data
            if (last is not None and seq >= last) or msg.metadata.num_pending == 0:
                return
    finally:
        with contextlib.suppress(NatsError):
            await sub.unsubscribe()
