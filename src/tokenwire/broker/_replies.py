"""``ReplyInbox``: replies on one wildcard inbox handed to a plain function as they are parsed.

The second place tokenwire reaches below nats-py's public API (ADR 0008; the first is
``_frames.py``). Every chunk the gateway publishes comes back as a JetStream ack; instead of a
``Msg`` on the subscription's queue and a coroutine per reply, the inbox's subscription id is
looked up when nats-py's parser hands over a message (``Client._process_msg``, wrapped once
per connection) and the reply goes to ``on_reply(token, data, status)`` in the reading task.
The same tap (:func:`tap`) hands a pull consumer its deliveries raw (``_consumer.py``), the
header block unparsed. If a nats-py release renames what this uses (:data:`_PRIVATE_API`),
replies take the public path with the same ``on_reply`` and tests/broker/test_replies.py
fails. What each path costs: docs/benchmarks.md, "Figures behind the code's choices".
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

log = logging.getLogger("tokenwire.broker")

OnReply = Callable[[str, bytes, int | None], None]
"""``on_reply(token, data, status)``: the subject's last token, the payload, and the status of
a status-only message (``503``: no responders) or ``None``. Runs in nats-py's reading task:
it must not block, and what it raises is logged, never raised into the parser."""

RawHandler = Callable[[bytes, bytes, bytes, bytes | None], None]
"""``handler(subject, reply, data, header_block)`` for every message of a tapped subscription
(``header_block`` is ``None`` for a plain ``MSG``). Runs in nats-py's reading task: it must not
block, and what it raises is logged, never raised into the parser."""

_PROCESS_MSG = "_process_msg"
_PRIVATE_API = (_PROCESS_MSG, "stats")
_TAPS = "_tokenwire_reply_taps"
_STATUS_AT = len(b"NATS/1.0 ")


class _ProcessMsg(Protocol):
    """``Client._process_msg``; ``headers`` is the raw header block, ``None`` for a plain
    ``MSG`` (nats-py annotates it as bytes)."""

    def __call__(
        self, sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes
    ) -> Awaitable[None]: ...


def status_of(headers: bytes | None) -> int | None:
    """The inline status of a message's raw header block (``NATS/1.0 503\\r\\n\\r\\n``)."""
    if not headers or headers[_STATUS_AT - 1 : _STATUS_AT] != b" ":
        return None
    code = headers[_STATUS_AT : _STATUS_AT + 3]
    return int(code) if code.isdigit() else None


def header_fields(headers: bytes | None) -> dict[str, str]:
    """The ``Name: value`` lines of a raw header block, parsed as nats-py parses them (split at
    the first ``:``, both sides stripped, names with whitespace or non-ASCII skipped; the
    ``NATS/1.0`` line and an inline status are not fields)."""
    fields: dict[str, str] = {}
    if not headers:
        return fields
    for line in headers.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        key = name.strip()
        if not sep or not key.isascii() or any(c in key for c in b" \t\v\f"):
            continue
        fields[key.decode("ascii")] = value.strip().decode("utf-8", "replace")
    return fields


def header_value(headers: bytes | None, name: bytes) -> str | None:
    """One field of a raw header block (``name`` as the sender spells it, e.g.
    ``b"Nats-Pin-Id"``) without parsing the rest."""
    if not headers:
        return None
    at = headers.find(b"\r\n" + name + b":")
    if at < 0:
        return None
    start = at + len(name) + 3
    end = headers.find(b"\r\n", start)
    return headers[start : end if end >= 0 else len(headers)].strip().decode("utf-8", "replace")


class ReplyInbox:
    """One wildcard inbox on ``nc`` whose replies go to ``on_reply``.

    ::

        inbox = await ReplyInbox(nc, on_reply).start()
        await nc.publish(subject, data, reply=inbox.prefix + token)
        ...
        await inbox.close()
    """

    def __init__(self, nc: Client, on_reply: OnReply) -> None:
        self._nc = nc
        self._on_reply = on_reply
        self.prefix = ""
        self.direct = tappable(nc)
        self._sub: Subscription | None = None

    async def start(self) -> ReplyInbox:
        """Subscribe ``<new inbox>.*``; returns self."""
        self.prefix = self._nc.new_inbox() + "."
        self._sub = await self._nc.subscribe(self.prefix + "*", cb=self._on_msg)
        if self.direct:
            cut, on_reply = len(self.prefix), self._on_reply

            def on_raw(subject: bytes, reply: bytes, data: bytes, headers: bytes | None) -> None:
                _deliver(on_reply, subject[cut:].decode(), data, status_of(headers))

            tap(self._nc, self._sub, on_raw)
        return self

    async def close(self) -> None:
        """Unsubscribe (replies after this are dropped)."""
        if self._sub is None:
            return
        untap(self._nc, self._sub)
        if not self._nc.is_closed:
            with contextlib.suppress(NatsError):
                await self._sub.unsubscribe()
        self._sub = None

    async def _on_msg(self, msg: Msg) -> None:
        """The public path (see the module docstring)."""
        status = msg.headers.get("Status") if msg.headers else None
        code = (int(status) if status.isdigit() else 503) if status is not None else None
        _deliver(self._on_reply, msg.subject[len(self.prefix) :], msg.data, code)


def tappable(nc: Client) -> bool:
    """Whether this nats-py has what :func:`tap` uses (:data:`_PRIVATE_API`)."""
    return all(hasattr(nc, name) for name in _PRIVATE_API)


def tap(nc: Client, sub: Subscription, handler: RawHandler) -> bool:
    """Hand every message of ``sub`` to ``handler`` as nats-py's parser reads it, instead of
    a ``Msg`` on the subscription's queue. False (nothing changed: the subscription's own
    callback gets its messages) when this nats-py lacks what the tap uses."""
    if not tappable(nc):
        return False
    _taps(nc)[sub._id] = handler
    return True


def untap(nc: Client, sub: Subscription) -> None:
    """Stop tapping ``sub`` (its messages go to its callback again, until it unsubscribes)."""
    taps: dict[int, RawHandler] | None = getattr(nc, _TAPS, None)
    if taps is not None:
        taps.pop(sub._id, None)


def _taps(nc: Client) -> dict[int, RawHandler]:
    """The connection's tapped subscriptions (sid -> handler), installing the wrapper of
    ``_process_msg`` on first use."""
    taps: dict[int, RawHandler] | None = getattr(nc, _TAPS, None)
    if taps is None:
        taps = {}
        setattr(nc, _TAPS, taps)
        # setattr: mypy refuses assigning to a method, which is what this does on purpose
        setattr(nc, _PROCESS_MSG, _tapped(nc, nc._process_msg, taps))
    return taps


def _tapped(nc: Client, original: _ProcessMsg, taps: dict[int, RawHandler]) -> _ProcessMsg:
    stats = nc.stats

    async def process_msg(
        sid: int, subject: bytes, reply: bytes, data: bytes, headers: bytes
    ) -> None:
        handler = taps.get(sid)
        if handler is None:
            await original(sid, subject, reply, data, headers)
            return
        stats["in_msgs"] += 1
        stats["in_bytes"] += len(data)
        try:
            handler(subject, reply, data, headers or None)
        except Exception:
            log.exception("a tapped handler failed on %r", subject)

    return process_msg


def _deliver(on_reply: OnReply, token: str, data: bytes, status: int | None) -> None:
    try:
        on_reply(token, data, status)
    except Exception:
        log.exception("a reply handler failed on %r", token)
