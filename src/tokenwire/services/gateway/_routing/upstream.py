"""The provider seam: :class:`Upstream` calls a provider and returns its :class:`UpstreamCall`;
:class:`HttpUpstream` is the real one, ``canned.py`` its twin for unit tests.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol

from tokenwire.providers import Normaliser, ProviderRequest, ProviderSession, SentRequest
from tokenwire.schemas import StreamChunk
from tokenwire.services.gateway._routing.routing import Route


class UpstreamCall(Protocol):
    """One provider call, already on its way (:meth:`Upstream.send`)."""

    def batches(
        self, normaliser: Normaliser, every_s: float = 0.0
    ) -> AsyncGenerator[list[StreamChunk], None]:
        """The call's normalised chunks in lists (those of one network read together, maybe
        none), ending with exactly one ``finish``. A non-2xx answer raises
        :class:`tokenwire.providers.ProviderHTTPError` before any chunk; a transport failure
        ends the stream with ``finish {error}`` (the contract of
        :func:`tokenwire.providers.stream_batches`). ``every_s``: once a read brought a
        chunk, each later read waits that long after the last (coalesced reads, ADR 0032).
        Called at most once."""
        ...

    def cancel(self) -> None:
        """The answer is not wanted (the step ended before reading it): whatever the call
        holds is let go. Nothing once :meth:`batches` began reading."""
        ...


class Upstream(Protocol):
    """Calls providers."""

    def send(self, route: Route, body: bytes) -> UpstreamCall:
        """Send ``body`` to the route, now where the transport can (so that the provider
        works while the step is set up), and return the call to read or cancel."""
        ...


class HttpUpstream:
    """The real :class:`Upstream`: one pooled :class:`tokenwire.providers.ProviderSession`
    for every provider call.

    Build it inside the running event loop (``broker_deps`` does); close it with
    :meth:`aclose`.
    """

    def __init__(self) -> None:
        self._session = ProviderSession()

    def send(self, route: Route, body: bytes) -> SentRequest:
        """Send ``body`` to the route: written at once on a pooled connection (else once the
        answer is first read, after connecting)."""
        headers = {**route.headers, "content-type": "application/json"}
        return self._session.send(ProviderRequest(route.url, body, headers, route.provider))

    async def aclose(self) -> None:
        """Close the pooled connections."""
        await self._session.close()
