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
"""

from __future__ import annotations

import uuid
from typing import Any

from nats.js import JetStreamContext, api

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
