"""Shared allowances: one KV bucket of counters every gateway updates by compare-and-set
(docs/gateway.md, "Limits and budgets"; ADR 0042).

The bucket (``Topology.limits_bucket``, ``tokenwire-limits``) holds one :class:`Pool` per
counter (a key's or a tenant's requests of one minute, tokens of one minute, streams now, or
spend of one day or month): ``used`` is what is spent for good, ``holds`` what each gateway
holds leased and may spend without asking again, with the time its lease ends. A change is a
read of the key's last message and a write conditioned on its revision
(``Nats-Expected-Last-Subject-Sequence``), retried on conflict: of all the gateways changing
one counter at once, each change applies to the state the others left, so a sum that must
stay under a limit does. Each write carries a per-message TTL (``Nats-TTL``): a window's
counter leaves the bucket by itself once its period is over.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.js.errors import NotFoundError

from tokenwire.broker._errors import RequestFailed
from tokenwire.broker._kvwrite import EXPECTED_LAST, put_checked
from tokenwire.broker._translate import translated

_NO_MESSAGE = 10037
_STREAM_NOT_FOUND = 10059
MAX_ATTEMPTS = 64
"""Conflicting writes one change retries before it gives up (RequestFailed): every retry
means another gateway's change applied meanwhile."""


class Hold(msgspec.Struct, frozen=True, array_like=True):
    """What one gateway holds of a pool: ``amount``, until ``until_ns`` (Unix ns, the
    holder's clock), renewed while it lives."""

    amount: int
    until_ns: int


class Pool(msgspec.Struct, frozen=True, omit_defaults=True):
    """One counter: ``used`` for good, and the gateways' ``holds`` by gateway id."""

    used: int = 0
    holds: dict[str, Hold] = {}

    def held(self, *, now_ns: int, but: str = "") -> int:
        """What the live holds (those not ended at ``now_ns``) add up to, ``but``'s aside."""
        return sum(h.amount for g, h in self.holds.items() if g != but and h.until_ns > now_ns)


EMPTY = Pool()
_decoder = msgspec.json.Decoder(Pool)
_encoder = msgspec.json.Encoder()
Change = Callable[[Pool], Pool | None]
"""What a change does to the pool it finds: the pool to write, or None to leave it as it is."""


def ttl_header(seconds: float) -> str:
    """``Nats-TTL`` in whole seconds, at least 1 (the server's smallest)."""
    return f"{max(1, math.ceil(seconds))}s"


class Allowances:
    """The real allowances board over one connection (``MemoryAllowances`` is its twin).

    ::

        board = Allowances(nc, "tokenwire-limits")
        pool = await board.update("rpm.key.agent.29543210", grant, ttl_s=180)

    ``restore``: what brings the bucket back when the broker says it is missing (a
    :class:`~tokenwire.broker.Restorer`'s), tried once per change. A request that times out
    (``timeout_s``) is tried again twice: its write may have applied, and the retry reads
    that back and changes again, which only ever counts more.
    """

    def __init__(
        self,
        nc: Client,
        bucket: str,
        *,
        timeout_s: float = 5.0,
        restore: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        self._nc = nc
        self.bucket = bucket
        self._stream = f"KV_{bucket}"
        self._timeout = timeout_s
        self._restore = restore

    async def update(self, key: str, change: Change, *, ttl_s: float) -> Pool:
        """Apply ``change`` to ``key``'s pool by compare-and-set, retried on conflict; the
        pool as written (or as found, when ``change`` left it)."""
        try:
            return await self._update(key, change, ttl_s)
        except RequestFailed as exc:
            if exc.code != _STREAM_NOT_FOUND or self._restore is None:
                raise
            await self._restore()
            return await self._update(key, change, ttl_s)

    async def _update(self, key: str, change: Change, ttl_s: float) -> Pool:
        timeouts = 0
        for _ in range(MAX_ATTEMPTS):
            try:
                pool, revision = await self._read(key)
                changed = change(pool)
                if changed is None:
                    return pool
                if await self._write(key, changed, revision=revision, ttl_s=ttl_s):
                    return changed
            except RequestFailed as exc:
                # A write whose answer timed out may have applied: the retry reads it back
                # and changes again, which only ever counts more (never lets a limit pass).
                timeouts += 1
                if not isinstance(exc.__cause__, TimeoutError) or timeouts > 2:
                    raise
        raise RequestFailed(f"allowance {key}", f"{MAX_ATTEMPTS} conflicting writes in a row")

    async def read(self, key: str) -> Pool:
        """``key``'s pool as the bucket's leader holds it now (empty when there is none)."""
        return (await self._read(key))[0]

    async def pools(self) -> dict[str, Pool]:
        """Every counter the bucket holds, by key (for ``tokenwire limits``)."""
        prefix = f"$KV.{self.bucket}."
        what = f"subjects of {self._stream}"
        with translated(self._nc, what):
            reply = await self._nc.request(
                f"$JS.API.STREAM.INFO.{self._stream}",
                _encoder.encode({"subjects_filter": prefix + ">"}),
                self._timeout,
            )
            info: dict[str, Any] = msgspec.json.decode(reply.data)
        if "error" in info:
            error = info["error"]
            raise RequestFailed(what, str(error.get("description")), error.get("err_code"))
        subjects = sorted((info.get("state") or {}).get("subjects") or {})
        found = {}
        for subject in subjects:
            key = subject.removeprefix(prefix)
            with contextlib.suppress(RequestFailed):  # gone meanwhile (its TTL)
                found[key] = await self.read(key)
        return found

    async def _read(self, key: str) -> tuple[Pool, int]:
        with translated(self._nc, f"allowance {key}"):
            try:
                msg = await self._nc.jetstream().get_last_msg(self._stream, self._subject(key))
            except NotFoundError as exc:
                if exc.err_code != _NO_MESSAGE:
                    raise
                return EMPTY, 0
        if (msg.headers or {}).get("KV-Operation") in ("DEL", "PURGE") or not msg.data:
            return EMPTY, msg.seq or 0
        try:
            return _decoder.decode(msg.data), msg.seq or 0
        except msgspec.DecodeError as exc:
            raise RequestFailed(f"allowance {key}", f"undecodable pool: {exc}") from exc

    async def _write(self, key: str, pool: Pool, *, revision: int, ttl_s: float) -> bool:
        headers = {EXPECTED_LAST: str(revision), "Nats-TTL": ttl_header(ttl_s)}
        written = await put_checked(
            self._nc,
            self._subject(key),
            _encoder.encode(pool),
            headers=headers,
            timeout_s=self._timeout,
            what=f"allowance {key}",
        )
        return written is not None

    def _subject(self, key: str) -> str:
        return f"$KV.{self.bucket}.{key}"


class MemoryAllowances:
    """:class:`Allowances` in a dict (one board for every gateway of a test that shares it);
    ``down`` makes every call raise ``RequestFailed``, as an unreachable broker does."""

    def __init__(self) -> None:
        self.pools_by_key: dict[str, Pool] = {}
        self.down = False
        self.writes = 0

    async def update(self, key: str, change: Change, *, ttl_s: float) -> Pool:
        self._check(key)
        pool = self.pools_by_key.get(key, EMPTY)
        changed = change(pool)
        if changed is None:
            return pool
        self.pools_by_key[key] = changed
        self.writes += 1
        return changed

    async def read(self, key: str) -> Pool:
        self._check(key)
        return self.pools_by_key.get(key, EMPTY)

    async def pools(self) -> dict[str, Pool]:
        self._check("*")
        return dict(sorted(self.pools_by_key.items()))

    def _check(self, key: str) -> None:
        if self.down:
            raise RequestFailed(f"allowance {key}", "the broker is down (memory twin)")
