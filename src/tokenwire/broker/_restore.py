"""Bringing back what the broker says is missing (issue 48, ADR 0035).

Every object provisioning creates is file-backed and survives a broker restart; one can still
go missing (a membership bucket of before issue 48 kept in memory, an object deleted by hand).
The process that relies on an object and meets "stream not found" (10059) or "consumer not
found" (10014) asks a :class:`Restorer` to create it again: create only (an existing object
keeps what provisioning set), at most once per object per ``interval_s``, each attempt bounded
and logged (a refused create names ``tokenwire provision``). Which user may create what under
deploy/nats/accounts.conf: docs/reliability.md, "Broker restarts".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from nats.aio.client import Client

from tokenwire.broker._api import (
    CONSUMER_NOT_FOUND,
    STREAM_NAME_IN_USE,
    STREAM_NOT_FOUND,
    api_request,
)
from tokenwire.broker._errors import BrokerError, RequestFailed
from tokenwire.broker._provision import (
    assembler_consumer_config,
    keys_bucket_config,
    limits_bucket_config,
    members_bucket_config,
    telemetry_ack_wait,
    telemetry_consumer_config,
)
from tokenwire.broker._topology import Topology
from tokenwire.broker._translate import translated

log = logging.getLogger(__name__)

CONSUMER_EXISTS = 10148
DEFAULT_INTERVAL_S = 5.0

Restored: TypeAlias = Literal["present", "restored", "failed", "later"]
"""What a restore found: the object was there; it was missing and is created again; it is
missing or unknown and could not be created (logged); nothing was tried (its last attempt was
less than ``interval_s`` ago)."""


def missing(exc: BrokerError) -> bool:
    """Whether ``exc`` is the broker saying a stream or a consumer does not exist."""
    return isinstance(exc, RequestFailed) and exc.code in (STREAM_NOT_FOUND, CONSUMER_NOT_FOUND)


def stream_missing(exc: BrokerError) -> bool:
    """Whether ``exc`` is the broker saying a stream does not exist."""
    return isinstance(exc, RequestFailed) and exc.code == STREAM_NOT_FOUND


@dataclass
class Restorer:
    """Re-creates the objects of ``topology`` a process relies on (see the module).

    ::

        restorer = Restorer(nc, topology)
        if await restorer.members(member_ttl_s=6.0) == "restored": ...
    """

    nc: Client
    topology: Topology
    interval_s: float = DEFAULT_INTERVAL_S
    timeout_s: float = 2.0
    clock: Callable[[], float] = time.monotonic
    restored: int = 0
    """Objects created again so far (a process exports it as a counter)."""
    _tried: dict[str, float] = field(default_factory=dict)

    async def members(self, member_ttl_s: float) -> Restored:
        """The assemblers' membership bucket."""
        return await self._stream(members_bucket_config(self.topology, member_ttl_s))

    async def keys_bucket(self) -> Restored:
        """The gateway keys bucket (empty when created again: the keys files seed it, and the
        keys created since must be created again; ADR 0041)."""
        return await self._stream(keys_bucket_config(self.topology))

    async def limits(self) -> Restored:
        """The keys' and tenants' allowances bucket (a gateway's limits and budgets): its
        counters are gone with it, so the gateways' leases start again from zero (ADR 0042)."""
        return await self._stream(limits_bucket_config(self.topology))

    async def assembler_consumer(
        self, partition: int, *, ack_wait_s: float, max_deliver: int, priority_timeout_s: float
    ) -> Restored:
        """Partition ``partition``'s durable consumer, with these settings if it is created."""
        t = self.topology
        config = assembler_consumer_config(
            t, partition, ack_wait_s, max_deliver, priority_timeout_s
        )
        return await self._consumer(t.stream_of_partition(partition), config)

    async def telemetry_consumer(
        self, stream: str, *, ack_wait_s: float | None = None, max_deliver: int = 10
    ) -> Restored:
        """The ``telemetry`` durable consumer of chunk stream ``stream``."""
        wait = ack_wait_s or telemetry_ack_wait(self.topology)
        return await self._consumer(
            stream, telemetry_consumer_config(self.topology, wait, max_deliver)
        )

    async def provision(self, ensure: Callable[[], Awaitable[None]]) -> Restored:
        """Provision again (``ensure``: the process's own ``ensure_topology`` call, idempotent)
        after a stream was found missing: for processes that provision at start."""
        if not self._due("topology"):
            return "later"
        try:
            await ensure()
        except BrokerError as exc:
            log.error("a stream was missing and provisioning it again failed: %s", exc)
            return "failed"
        log.warning("a stream was missing on the broker: the topology is provisioned again")
        self.restored += 1
        return "restored"

    def _due(self, key: str) -> bool:
        now = self.clock()
        last = self._tried.get(key)
        if last is not None and now - last < self.interval_s:
            return False
        self._tried[key] = now
        return True

    async def _stream(self, config: dict[str, Any]) -> Restored:
        name = config["name"]
        what = f"stream {name}"
        if not self._due(what):
            return "later"
        found = await self._present(f"$JS.API.STREAM.INFO.{name}", what)
        if found != "missing":
            return found
        return await self._create(what, f"$JS.API.STREAM.CREATE.{name}", config)

    async def _consumer(self, stream: str, config: dict[str, Any]) -> Restored:
        name = config["name"]
        what = f"consumer {stream}/{name}"
        if not self._due(what):
            return "later"
        found = await self._present(f"$JS.API.CONSUMER.INFO.{stream}.{name}", what)
        if found != "missing":
            return found
        body = {"stream_name": stream, "config": config, "action": "create"}
        return await self._create(what, f"$JS.API.CONSUMER.CREATE.{stream}.{name}", body)

    async def _present(self, subject: str, what: str) -> Restored | Literal["missing"]:
        try:
            await self._request(subject, None)
        except BrokerError as exc:
            if missing(exc):
                return "missing"
            log.warning("could not tell whether %s exists: %s", what, exc)
            return "failed"
        return "present"

    async def _create(self, what: str, subject: str, body: dict[str, Any]) -> Restored:
        try:
            await self._request(subject, body)
        except BrokerError as exc:
            if isinstance(exc, RequestFailed) and exc.code in (STREAM_NAME_IN_USE, CONSUMER_EXISTS):
                return "present"  # another process created it meanwhile
            log.error(
                "%s is missing and could not be created (%s): run `tokenwire provision`", what, exc
            )
            return "failed"
        log.warning("%s was missing on the broker: created again", what)
        self.restored += 1
        return "restored"

    async def _request(self, subject: str, body: dict[str, Any] | None) -> None:
        with translated(self.nc, subject):
            await api_request(self.nc, subject, body, timeout_s=self.timeout_s)
