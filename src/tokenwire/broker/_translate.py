"""nats-py's exceptions translated into the broker's, once, at the boundary.

The model is httpx's ``map_httpcore_exceptions``: every public broker operation that talks to
the server runs inside :func:`translated`, so a caller outside this package handles
:class:`~tokenwire.broker.BrokerError` leaves only and never imports ``nats``. The original
exception stays attached as ``__cause__``.

- the connection closed for good, or no server at all -> ``BrokerUnavailable(url)``;
- anything else nats-py raises (no responders, a timeout, a JetStream error reply), our own
  API error replies, an undecodable reply, and asyncio's ``TimeoutError`` ->
  ``RequestFailed(what)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import msgspec
from nats.aio.client import Client
from nats.errors import ConnectionClosedError, NoServersError
from nats.errors import Error as NatsError
from nats.js.errors import APIError

from tokenwire.broker._api import ApiError, server_url
from tokenwire.broker._errors import BrokerUnavailable, RequestFailed


@contextmanager
def translated(nc: Client, what: str) -> Iterator[None]:
    """Run the block; a nats-py error (or a timeout) leaves it as a broker error (see module)."""
    try:
        yield
    except (ConnectionClosedError, NoServersError) as exc:
        raise BrokerUnavailable(server_url(nc), f"{what}: {_name(exc)}") from exc
    except ApiError as exc:
        raise RequestFailed(what, exc.description, exc.err_code) from exc
    except APIError as exc:
        raise RequestFailed(what, exc.description or _name(exc), exc.err_code) from exc
    except (NatsError, TimeoutError) as exc:
        raise RequestFailed(what, _name(exc)) from exc
    except msgspec.DecodeError as exc:
        raise RequestFailed(what, f"undecodable reply: {exc}") from exc


def _name(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
