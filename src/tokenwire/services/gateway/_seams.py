"""The gateway's seams: calling a provider, publishing a chunk, allocating steps, readiness.

Each is a small Protocol with the real implementation here and an in-memory one in
``_memory.py``. :class:`GatewayDeps` bundles them with the injected clock and id source.
"""

from __future__ import annotations

import itertools
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import httpx
from starlette.routing import BaseRoute

from tokenwire.broker import PublisherStats, StepClaimConflict
from tokenwire.providers import Normaliser, stream_chunks
from tokenwire.schemas import StreamChunk
from tokenwire.services.gateway._identity import StepAllocator, StepTaken
from tokenwire.services.gateway._routing import Route

UPSTREAM_TIMEOUT = httpx.Timeout(connect=10.0, read=120.0, write=30.0, pool=30.0)
"""``read`` is the longest silence tolerated between provider bytes (a stall ends the step)."""


KEEPALIVE_EXPIRY_S = 2.0
"""Idle provider connections are dropped after this long. httpx's default (5 s) equals
uvicorn's keep-alive timeout, so a connection reused just as the server closed it failed the
step with a ReadError before its first chunk (a 502; seen under load in bench/bench_gateway.py);
servers keep idle connections at least this long, so 2 s avoids that race."""


class Upstream(Protocol):
    """Calls a provider and yields its normalised chunks, ending with exactly one ``finish``.

    A non-2xx answer raises :class:`tokenwire.providers.ProviderHTTPError` before any chunk;
    a transport failure ends the stream with ``finish {error}`` (the contract of
    :func:`tokenwire.providers.stream_chunks`).
    """

    def stream(
        self, route: Route, body: bytes, normaliser: Normaliser
    ) -> AsyncIterator[StreamChunk]: ...


class ChunkSink(Protocol):
    """Pipelined publishing of a step's chunks (``tokenwire.broker.ChunkPublisher``'s surface).

    ``publish`` returns once the chunk is on the wire and waits only when the bounded window is
    full; ``wait_acked`` returns when every chunk of the step is acknowledged or raises the
    step's :class:`tokenwire.broker.BrokerError`.
    """

    async def publish(
        self,
        envelope_bytes: bytes,
        session: str,
        turn: int,
        step: int,
        ordinal: int,
        *,
        first: bool,
        headers: dict[str, str] | None = None,
    ) -> None: ...

    async def wait_acked(
        self, session: str, turn: int, step: int, timeout_s: float | None = None
    ) -> None: ...

    def stats(self) -> PublisherStats: ...


class HttpUpstream:
    """The real :class:`Upstream`: pooled HTTP connections to the providers.

    The pool is split over ``shards`` ``httpx.AsyncClient`` s used in turn, because httpcore
    scans every connection of a pool whenever a response closes: with hundreds of concurrent
    streams in one pool that scan dominated the gateway's CPU (bench/bench_gateway.py).
    Each shard keeps at most ``keepalive_per_shard`` idle connections.
    """

    def __init__(self, shards: int = 32, keepalive_per_shard: int = 32) -> None:
        limits = httpx.Limits(
            max_connections=None,
            max_keepalive_connections=keepalive_per_shard,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        )
        tls = ssl.create_default_context()  # one CA bundle load, not one per shard
        self._clients = [
            httpx.AsyncClient(timeout=UPSTREAM_TIMEOUT, limits=limits, verify=tls)
            for _ in range(shards)
        ]
        self._turn = itertools.cycle(self._clients)

    def stream(
        self, route: Route, body: bytes, normaliser: Normaliser
    ) -> AsyncIterator[StreamChunk]:
        """Send ``body`` to the route and stream its chunks."""
        client = next(self._turn)
        headers = {**route.headers, "content-type": "application/json"}
        request = client.build_request("POST", route.url, content=body, headers=headers)
        return stream_chunks(client, request, normaliser)

    async def aclose(self) -> None:
        """Close the pooled connections."""
        for client in self._clients:
            await client.aclose()


def registry_conflicts() -> tuple[type[Exception], ...]:
    """The exceptions meaning "triple already claimed" for the real and in-memory allocators."""
    return (StepClaimConflict, StepTaken)


def _new_session() -> str:
    return uuid.uuid4().hex


async def _always_ready() -> bool:
    return True


@dataclass(frozen=True)
class GatewayDeps:
    """What the app runs on. ``run()`` builds the real ones; tests pass fakes.

    - ``upstream``: calls providers; ``sink``: publishes chunks; ``steps``: claims steps;
    - ``ready``: whether the broker is connected and the stream present (``/readyz``);
    - ``clock_ns``: wall clock in Unix ns (envelope times); ``new_id``: session and response
      ids; ``monotonic``: for durations (metrics);
    - ``extra_routes``: routes served beside the gateway's own (the session events, sessions,
      messages and viewer routes of ``tokenwire.replay``).
    """

    upstream: Upstream
    sink: ChunkSink
    steps: StepAllocator
    ready: Callable[[], Awaitable[bool]] = _always_ready
    clock_ns: Callable[[], int] = time.time_ns
    new_id: Callable[[], str] = _new_session
    monotonic: Callable[[], float] = time.perf_counter
    conflicts: tuple[type[Exception], ...] = field(default_factory=registry_conflicts)
    extra_routes: Sequence[BaseRoute] = ()
