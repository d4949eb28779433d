"""Session events published at least once, stored once: :class:`EventPublisher`.

The assembler announces each committed step (``<prefix>.events.<r>.<session>.persisted``)
after the commit. A core publish is lost whenever the session's events stream has no leader
(an election after a node dies). So each event is published with a reply and waits for its
stream's ack in a task of its own. A publish that fails is tried again with back-off for at
most ``retry_for_s``. Every try carries the same ``Nats-Msg-Id``, and ``retry_for_s`` stays
inside the stream's duplicate window, so a try that landed unacknowledged and its retry are
stored once.

Bounds: at most ``max_pending`` events unacknowledged. :meth:`EventPublisher.publish` then
waits for a slot: the caller's commits pause, and nothing is dropped. An event not stored
within ``retry_for_s`` is given up: logged, and passed to ``on_given_up``. The step itself is
durable in the store whatever happens to its announcement.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable

from nats.aio.client import Client

from tokenwire.broker._errors import BrokerError
from tokenwire.broker._messages import publish_acked

log = logging.getLogger(__name__)

MAX_PENDING = 10_000
"""Events in flight at most (a few hundred bytes each); then ``publish`` waits for a slot."""
RETRY_FOR_S = 60.0
"""How long an event is tried: half the default duplicate window (120 s)."""
ACK_TIMEOUT_S = 2.0
"""How long one try waits for the stream's ack."""
BACKOFF_S = (0.05, 0.2, 0.5, 1.0, 2.0)
"""The pause before try n+1 (the last one repeats)."""


class EventPublisher:
    """Publishes events at least once (stored once, by ``Nats-Msg-Id``), ``max_pending`` at a
    time; :meth:`close` waits for those in flight, bounded."""

    def __init__(
        self,
        nc: Client,
        *,
        max_pending: int = MAX_PENDING,
        retry_for_s: float = RETRY_FOR_S,
        ack_timeout_s: float = ACK_TIMEOUT_S,
        on_given_up: Callable[[int], None] = lambda n: None,
    ) -> None:
        self._nc = nc
        self._slots = asyncio.Semaphore(max_pending)
        self._retry_for_s = retry_for_s
        self._ack_timeout_s = ack_timeout_s
        self._tasks: set[asyncio.Task[None]] = set()
        self._given_up = on_given_up
        """Told how many events were given up (not stored within ``retry_for_s``, or still
        unacknowledged at :meth:`close`)."""

    @property
    def pending(self) -> int:
        """Events published and not acknowledged yet."""
        return len(self._tasks)

    async def publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        """Hand the event over; returns at once while a slot is free, else when one frees."""
        await self._slots.acquire()
        task = asyncio.create_task(self._deliver(subject, payload, msg_id))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    async def close(self, timeout_s: float) -> int:
        """Wait up to ``timeout_s`` for the events in flight; the rest are given up. Returns
        how many were given up."""
        if not self._tasks:
            return 0
        _, left = await asyncio.wait(set(self._tasks), timeout=timeout_s)
        for task in left:
            task.cancel()
        await asyncio.gather(*left, return_exceptions=True)
        if left:
            self._given_up(len(left))
        return len(left)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._slots.release()

    async def _deliver(self, subject: str, payload: bytes, msg_id: str) -> None:
        headers = {"Nats-Msg-Id": msg_id}
        deadline = time.monotonic() + self._retry_for_s
        for attempt in itertools.count():  # ends by the deadline
            try:
                await publish_acked(
                    self._nc, subject, payload, headers=headers, timeout_s=self._ack_timeout_s
                )
                return
            except BrokerError as exc:
                pause = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
                if time.monotonic() + pause > deadline:
                    self._given_up(1)
                    log.warning(
                        "event %s not stored within %.0f s, given up: %s",
                        msg_id,
                        self._retry_for_s,
                        exc,
                    )
                    return
            await asyncio.sleep(pause)
