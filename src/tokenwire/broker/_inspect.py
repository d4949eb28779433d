"""What the server knows, for services and operators: consumer state, the subjects a stream
holds, stream and consumer listings, the connected server. Read-only requests; each raises
:class:`~tokenwire.broker.RequestFailed` (or ``BrokerUnavailable``) when unanswered.
"""

from __future__ import annotations

import datetime
from typing import Any

import msgspec
from nats.aio.client import Client

from tokenwire.broker._api import api_request
from tokenwire.broker._errors import RequestFailed
from tokenwire.broker._translate import translated


class _Floor(msgspec.Struct):
    stream_seq: int = 0
    consumer_seq: int = 0
    last_active: datetime.datetime | None = None


class _Group(msgspec.Struct):
    group: str = ""
    pinned_client_id: str = ""


class ConsumerState(msgspec.Struct):
    """The fields of ``$JS.API.CONSUMER.INFO`` the services read.

    ``ack_floor.stream_seq``: every message at or below it is settled; ``delivered.stream_seq``:
    the highest message delivered to any client of the consumer (``consumer_seq``: how many
    deliveries it made; ``last_active``: when it made the last); ``priority_groups``: who
    holds each group's pin; ``created`` and ``ts`` (when the server answered) are the
    server's clock.
    """

    num_pending: int = 0
    num_ack_pending: int = 0
    ack_floor: _Floor = msgspec.field(default_factory=_Floor)
    delivered: _Floor = msgspec.field(default_factory=_Floor)
    priority_groups: list[_Group] = msgspec.field(default_factory=list)
    created: datetime.datetime | None = None
    ts: datetime.datetime | None = None

    @property
    def work(self) -> bool:
        """Messages wait for a delivery or an acknowledgement."""
        return self.num_pending > 0 or self.num_ack_pending > 0

    def waited_s(self) -> float:
        """How long the undelivered messages have waited without a delivery: from the
        consumer's last delivery (its creation, when it made none) to the answer, on the
        server's clock; 0 when nothing waits (or the server did not say)."""
        since = self.delivered.last_active or self.created
        if self.num_pending == 0 or since is None or self.ts is None:
            return 0.0
        return max(0.0, (self.ts - since).total_seconds())

    def pinned(self, group: str) -> str | None:
        """The id of the client holding ``group``'s pin (None: no one)."""
        pins = [g.pinned_client_id for g in self.priority_groups if g.group == group]
        return pins[0] or None if pins else None


class _StateReply(ConsumerState):
    error: dict[str, Any] | None = None


_state_decoder = msgspec.json.Decoder(_StateReply)


async def consumer_state(
    nc: Client, stream: str, consumer: str, timeout_s: float = 2.0
) -> ConsumerState:
    """The consumer's pending counts, ack floor, delivered counts and pins."""
    what = f"consumer info of {stream}/{consumer}"
    with translated(nc, what):
        reply = await nc.request(f"$JS.API.CONSUMER.INFO.{stream}.{consumer}", b"", timeout_s)
        state = _state_decoder.decode(reply.data)
    if state.error is not None:
        raise RequestFailed(what, str(state.error.get("description")), state.error.get("err_code"))
    return state


async def stream_info(
    nc: Client, stream: str, *, subjects: str | None = None, timeout_s: float = 5.0
) -> dict[str, Any]:
    """``$JS.API.STREAM.INFO`` of ``stream`` (its ``config`` and ``state``); with ``subjects``,
    ``state.subjects`` counts the messages of each matching subject. Answered by the stream's
    leader, never a follower."""
    body = {"subjects_filter": subjects} if subjects is not None else None
    return await jetstream_request(nc, f"$JS.API.STREAM.INFO.{stream}", body, timeout_s)


async def stream_subjects(
    nc: Client, stream: str, subjects: str, timeout_s: float = 5.0
) -> dict[str, int]:
    """Subject -> message count of the subjects of ``stream`` matching ``subjects``, as the
    stream's leader holds them."""
    info = await stream_info(nc, stream, subjects=subjects, timeout_s=timeout_s)
    found: dict[str, int] = (info.get("state") or {}).get("subjects") or {}
    return found


async def jetstream_request(
    nc: Client, subject: str, body: dict[str, Any] | None = None, timeout_s: float = 5.0
) -> dict[str, Any]:
    """One ``$JS.API...`` request, its decoded reply; RequestFailed on no answer or an error."""
    with translated(nc, subject):
        return await api_request(nc, subject, body, timeout_s)


class ServerInfo(msgspec.Struct, frozen=True):
    """The connected server, as it introduced itself (its INFO)."""

    url: str | None
    version: str | None
    name: str | None
    jetstream: bool
    max_payload: int


def server_info(nc: Client) -> ServerInfo:
    """Who ``nc`` is connected to now (``url`` None while disconnected).

    nats-py keeps the server's INFO in the private ``Client._server_info`` (listed in ADR
    0008; tests/broker/test_private_api.py fails when it is renamed); without it the version
    comes from the public ``connected_server_version`` and the rest stays unknown.
    """
    info: dict[str, Any] = getattr(nc, "_server_info", None) or {}
    url = nc.connected_url
    version = info.get("version")
    if version is None and nc.is_connected:
        v = nc.connected_server_version
        version = f"{v.major}.{v.minor}.{v.patch}"
    return ServerInfo(
        url=url.geturl() if url is not None else None,
        version=version,
        name=info.get("server_name"),
        jetstream=bool(info.get("jetstream")),
        max_payload=nc.max_payload,
    )
