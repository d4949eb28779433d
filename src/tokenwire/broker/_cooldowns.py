"""Shared deployment cooldowns: one KV bucket that every gateway of a deployment writes and
watches (docs/broker.md, "Deployment cooldowns"; ADR 0040).

The bucket (``Topology.cooldowns_bucket``, ``tokenwire-cooldowns``) holds one key per routed
deployment (the routes file's deployment name); its last message is the deployment's state:

- **cooling** (``{"state": "cooling", "reason", "seconds"}``, ``Nats-TTL`` the cooldown
  rounded up plus one second): every gateway skips it. When the TTL ends the server removes
  the value and leaves a ``MaxAge`` marker, which reaches every watcher at once: the cooldown
  is over and the deployment is due for one probe (:class:`ProbeDue`).
- **probing** (``Nats-TTL`` the probe's bound), written by compare-and-set on the marker's
  revision: of all the gateways that want to probe it, one wins and sends one request; the
  others go on skipping it. A prober that dies lets it expire into a new marker.
- **a delete** (``KV-Operation: DEL``), or no message: healthy (:class:`Healthy`).

Per-message TTLs need nats-server 2.11+ (``allow_msg_ttl``); the server's TTL timer may end
a message a fraction of a second early, hence the extra second, and each event carries the
end the writer asked for (``until_ns``, from the broker's time of the write).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import api
from nats.js.errors import NotFoundError

from tokenwire.broker._errors import BrokerError, RequestFailed
from tokenwire.broker._kvwrite import EXPECTED_LAST, put_checked
from tokenwire.broker._ordered import ordered_subscribe
from tokenwire.broker._translate import translated

_NO_MESSAGE = 10037
_NS = 1_000_000_000
MARKER_TTL_S = 3600.0
"""How long a cooldown's end marker stays: a deployment nobody probed within it reads as
healthy again to a gateway that starts later."""
MAX_AGE_S = 24 * 3600.0
"""How long any message of the bucket is kept (the deletes that mark a healthy deployment)."""


class Cooling(msgspec.Struct, frozen=True):
    """Skip the deployment until ``until_ns`` (Unix ns, broker time of the write plus the
    cooldown); ``reason`` says why (``429 retry-after 30 s``, ``3 failures in 30 s``)."""

    deployment: str
    revision: int
    until_ns: int
    reason: str


class Probing(msgspec.Struct, frozen=True):
    """One gateway's request probes the deployment (until ``until_ns`` at most)."""

    deployment: str
    revision: int
    until_ns: int


class ProbeDue(msgspec.Struct, frozen=True):
    """The cooldown ended: the next gateway to win :meth:`CooldownBoard.claim_probe` with
    this ``revision`` sends the one probe."""

    deployment: str
    revision: int


class Healthy(msgspec.Struct, frozen=True):
    """Nothing holds the deployment back."""

    deployment: str
    revision: int


DeploymentState = Cooling | Probing | ProbeDue | Healthy
"""A deployment's shared state, as the bucket holds it."""


class ProbeClaim(msgspec.Struct, frozen=True):
    """The answer to a probe claim: ``won`` (the caller probes), and the state it left."""

    won: bool
    state: DeploymentState


class _Value(msgspec.Struct, frozen=True):
    state: Literal["cooling", "probing"]
    seconds: float
    reason: str = ""


_value_decoder = msgspec.json.Decoder(_Value)


def state_of(
    deployment: str, revision: int, time_ns: int, headers: dict[str, str] | None, data: bytes
) -> DeploymentState:
    """The state one stored message of the bucket says (a marker, a delete or a value)."""
    headers = headers or {}
    if headers.get("Nats-Marker-Reason") == "MaxAge":
        return ProbeDue(deployment, revision)
    if headers.get("KV-Operation") in ("DEL", "PURGE") or "Nats-Marker-Reason" in headers:
        return Healthy(deployment, revision)
    try:
        value = _value_decoder.decode(data)
    except msgspec.DecodeError:
        return Healthy(deployment, revision)  # not ours: nothing to hold the deployment back
    until_ns = time_ns + int(value.seconds * _NS)
    if value.state == "cooling":
        return Cooling(deployment, revision, until_ns, value.reason)
    return Probing(deployment, revision, until_ns)


def ttl_header(seconds: float) -> str:
    """``Nats-TTL`` for a state of ``seconds``: whole seconds, one more than asked (the
    server's timer may end it early), at least 1 s (the server's smallest)."""
    return f"{max(1, math.ceil(seconds) + 1)}s"


class Cooldowns:
    """The real :class:`CooldownBoard` over one connection (``MemoryCooldowns`` is its twin).

    Every request is one attempt bounded by ``timeout_s``; a broker that does not answer
    raises :class:`~tokenwire.broker.RequestFailed` (or ``BrokerUnavailable``).
    """

    def __init__(
        self,
        nc: Client,
        bucket: str,
        *,
        timeout_s: float = 2.0,
        make: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._nc = nc
        self.bucket = bucket
        self._stream = f"KV_{bucket}"
        self._timeout = timeout_s
        self._make = make

    async def ensure(self) -> bool:
        """Make the bucket again when this process may (``make``: a gateway that provisions);
        True when the bucket answers afterwards. For a gateway that found it missing (a
        broker restarted without it)."""
        if self._make is not None:
            await self._make()
        try:
            with translated(self._nc, f"info of {self._stream}"):
                await self._nc.jetstream().stream_info(self._stream)
        except RequestFailed:
            return False
        return True

    def _subject(self, deployment: str) -> str:
        return f"$KV.{self.bucket}.{deployment}"

    async def cool(self, deployment: str, *, reason: str, seconds: float) -> None:
        """Every gateway skips ``deployment`` for ``seconds`` from now (last writer wins)."""
        value = msgspec.json.encode(_Value("cooling", seconds, reason))
        await self._write(deployment, value, {"Nats-TTL": ttl_header(seconds)})

    async def claim_probe(self, deployment: str, *, revision: int, seconds: float) -> ProbeClaim:
        """Become the deployment's one prober for at most ``seconds``, if its state is still
        the one at ``revision`` (the :class:`ProbeDue` marker; 0: no message); else the state
        found instead (a :class:`Probing` of ``seconds`` when it cannot be read: lost all the
        same)."""
        value = msgspec.json.encode(_Value("probing", seconds))
        headers = {"Nats-TTL": ttl_header(seconds), EXPECTED_LAST: str(revision)}
        written = await self._write(deployment, value, headers)
        until_ns = time.time_ns() + int(seconds * _NS)
        if written is not None:
            return ProbeClaim(True, Probing(deployment, written, until_ns))
        try:
            return ProbeClaim(False, await self.state(deployment))
        except BrokerError:
            # refused all the same (another's write came first): held back at most as long as
            # a probe, until the watch tells what holds
            return ProbeClaim(False, Probing(deployment, revision, until_ns))

    async def clear(self, deployment: str) -> None:
        """The deployment is healthy again (its probe was answered)."""
        await self._write(deployment, b"", {"KV-Operation": "DEL"})

    async def state(self, deployment: str) -> DeploymentState:
        """The deployment's state as the bucket's leader holds it now."""
        js = self._nc.jetstream()
        with translated(self._nc, f"cooldown of {deployment}"):
            try:
                msg = await js.get_last_msg(self._stream, self._subject(deployment))
            except NotFoundError as exc:
                if exc.err_code != _NO_MESSAGE:
                    raise
                return Healthy(deployment, 0)
        stamp = int(msg.time.timestamp() * _NS) if msg.time is not None else 0
        return state_of(deployment, msg.seq or 0, stamp, msg.headers, msg.data or b"")

    async def states(self) -> list[DeploymentState]:
        """Every deployment the bucket holds a message for, by name."""
        what = f"subjects of {self._stream}"
        with translated(self._nc, what):
            reply = await self._nc.request(
                f"$JS.API.STREAM.INFO.{self._stream}",
                msgspec.json.encode({"subjects_filter": f"$KV.{self.bucket}.>"}),
                self._timeout,
            )
            info: dict[str, Any] = msgspec.json.decode(reply.data)
        if "error" in info:
            error = info["error"]
            raise RequestFailed(what, str(error.get("description")), error.get("err_code"))
        subjects = sorted((info.get("state") or {}).get("subjects") or {})
        prefix = f"$KV.{self.bucket}."
        return [await self.state(subject.removeprefix(prefix)) for subject in subjects]

    async def watch(self, on_state: Callable[[DeploymentState], None]) -> CooldownWatch:
        """Call ``on_state`` with every deployment's last state now, then with each change as
        the broker stores it (an ordered consumer; it recovers from gaps by itself)."""
        prefix = f"$KV.{self.bucket}."

        async def deliver(msg: Msg) -> None:
            meta = msg.metadata
            stamp = int(meta.timestamp.timestamp() * _NS)
            deployment = msg.subject.removeprefix(prefix)
            on_state(state_of(deployment, meta.sequence.stream, stamp, msg.headers, msg.data))

        config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT)
        with translated(self._nc, f"watch of {self._stream}"):
            sub = await ordered_subscribe(
                self._nc.jetstream(), prefix + ">", stream=self._stream, config=config, cb=deliver
            )
        return CooldownWatch(sub)

    async def _write(self, deployment: str, value: bytes, headers: dict[str, str]) -> int | None:
        """Store one message; its revision, None when the expected revision did not hold."""
        return await put_checked(
            self._nc,
            self._subject(deployment),
            value,
            headers=headers,
            timeout_s=self._timeout,
            what=f"cooldown of {deployment}",
        )


class CooldownWatch:
    """A running watch of the bucket (:meth:`Cooldowns.watch`); :meth:`stop` ends it."""

    def __init__(self, sub: Any) -> None:
        self._sub = sub

    async def stop(self) -> None:
        """Unsubscribe (the server drops the consumer)."""
        with contextlib.suppress(NatsError):
            await self._sub.unsubscribe()
