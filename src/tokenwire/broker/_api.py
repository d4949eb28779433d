"""Plain JetStream API requests, for what nats-py's typed API cannot express.

nats-py 2.16 has no priority-group fields on ``ConsumerConfig`` and no subject transform on a
stream create it validates; the server accepts both as JSON, so provisioning and the grouped
pull loop speak the JSON API directly.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Sequence
from typing import Any

import msgspec
import nats
from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError, NoServersError
from nats.errors import TimeoutError as NatsTimeoutError

from tokenwire.broker._errors import BrokerUnavailable
from tokenwire.scrub import register_urls

NS = 1_000_000_000
"""Nanoseconds per second: JetStream durations are integers in ns."""

STREAM_NAME_IN_USE = 10058
DEFAULT_INBOX = "_INBOX"


class ApiError(Exception):
    """A JetStream API error response (internal: callers translate it to a typed leaf)."""

    def __init__(self, subject: str, code: int, err_code: int, description: str) -> None:
        self.subject = subject
        self.code = code
        self.err_code = err_code
        self.description = description
        super().__init__(f"{subject}: {code}/{err_code} {description}")


async def api_request(
    nc: Client, subject: str, body: dict[str, Any] | None = None, timeout_s: float = 5.0
) -> dict[str, Any]:
    """Send one ``$JS.API...`` request and return the decoded reply; ApiError on an error reply."""
    payload = msgspec.json.encode(body) if body is not None else b""
    try:
        reply = await nc.request(subject, payload, timeout=timeout_s)
    except (NatsTimeoutError, NoRespondersError) as exc:
        raise ApiError(subject, 503, 0, f"no answer: {type(exc).__name__}") from exc
    data: dict[str, Any] = msgspec.json.decode(reply.data) if reply.data else {}
    error = data.get("error")
    if error is not None:
        raise ApiError(
            subject, int(error.get("code", 0)), int(error.get("err_code", 0)), error["description"]
        )
    return data


def server_url(nc: Client) -> str:
    """The URL of the server ``nc`` is connected to, for errors (``nats://?`` when none)."""
    server = nc.connected_url
    return server.geturl() if server is not None else "nats://?"


def split_urls(urls: str | Sequence[str]) -> list[str]:
    """``"a,b"`` or ``["a", "b"]`` -> a list of server URLs."""
    if isinstance(urls, str):
        return [u.strip() for u in urls.split(",") if u.strip()]
    return list(urls)


async def connect(
    urls: str | Sequence[str],
    *,
    name: str = "tokenwire",
    connect_timeout: float = 2.0,
    pending_size: int = 8 * 1024 * 1024,
) -> Client:
    """Connect to NATS (reconnecting forever once connected); BrokerUnavailable if nobody answers.

    ``pending_size`` bounds what nats-py buffers while disconnected; past it publishes fail
    fast with OutboundBufferLimitError, which the publisher treats as a retryable send.
    """
    servers = split_urls(urls)
    register_urls(servers)  # their passwords are scrubbed from whatever this process reports
    try:
        nc: Client = await nats.connect(
            servers=servers,
            name=name,
            connect_timeout=int(max(1, connect_timeout)),
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            pending_size=pending_size,
            error_cb=_ignore_error,
            inbox_prefix=inbox_prefix(servers),
        )
    except (NoServersError, OSError, TimeoutError, NatsError) as exc:
        raise BrokerUnavailable(",".join(servers), type(exc).__name__) from exc
    return nc


def inbox_prefix(servers: Sequence[str]) -> str:
    """``_INBOX.<user>`` for a URL with a user (``nats://gateway:pw@host``), else ``_INBOX``.

    Each deployed user may subscribe to its own inboxes only (deploy/nats/accounts.conf), so
    it cannot read the replies and ordered-consumer deliveries of another user.
    """
    for url in servers:
        user = urllib.parse.urlsplit(url if "://" in url else f"nats://{url}").username
        if user:
            return f"{DEFAULT_INBOX}.{urllib.parse.unquote(user)}"
    return DEFAULT_INBOX


async def _ignore_error(exc: Exception) -> None:
    """Reconnects and slow-consumer notices are expected; the typed paths surface real failures."""
