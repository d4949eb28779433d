"""The keys bucket: every gateway key (its hash, never the key) and tenant, replicated, watched
by every gateway (docs/gateway.md, "Keys and tenants"; ADR 0041).

The bucket (``Topology.keys_bucket``, ``tokenwire-keys``) holds ``key.<name>`` ->
:class:`~tokenwire.schemas.KeyRecord` JSON and ``tenant.<name>`` ->
:class:`~tokenwire.schemas.TenantRecord` JSON, one message per entry (the last one is the
entry). A revoke is a delete (``KV-Operation: DEL``): the delete marker stays, so a name once
in the bucket is never seeded from a keys file again. Writes are compare-and-set on the
entry's revision (``Nats-Expected-Last-Subject-Sequence``; 0: the name was never written).

:meth:`KeysBucket.watch` tells every entry's state now, then each change as the broker stores
it (an ordered consumer: it recovers from gaps by itself); :meth:`KeysBucket.last_revision`
lets a watcher check it is not behind.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js import api
from nats.js.errors import NotFoundError

from tokenwire.broker._errors import RequestFailed
from tokenwire.broker._kvwrite import EXPECTED_LAST, put_checked
from tokenwire.broker._ordered import ordered_subscribe
from tokenwire.broker._translate import translated
from tokenwire.schemas import KeyRecord, TenantRecord

log = logging.getLogger(__name__)

EntryKind: TypeAlias = Literal["key", "tenant"]
KINDS: tuple[EntryKind, ...] = ("key", "tenant")
_NO_MESSAGE = 10037
_key_decoder = msgspec.json.Decoder(KeyRecord)
_tenant_decoder = msgspec.json.Decoder(TenantRecord)


@dataclass(frozen=True, slots=True)
class KeyEntry:
    """One entry as stored: ``record`` None when deleted (a revoked key, a cleared tenant) or
    unreadable (``invalid`` says why; such a key is refused, never guessed at). A watch tells
    a message under no key or tenant subject as a key without a name, ``invalid``."""

    kind: EntryKind
    name: str
    revision: int
    record: KeyRecord | TenantRecord | None
    invalid: str = ""


def entry_of(
    kind: EntryKind, name: str, revision: int, headers: dict[str, str] | None, data: bytes
) -> KeyEntry:
    """The entry one stored message says (a delete marker, or a record)."""
    if (headers or {}).get("KV-Operation") in ("DEL", "PURGE"):
        return KeyEntry(kind, name, revision, None)
    decoder = _key_decoder if kind == "key" else _tenant_decoder
    try:
        record = decoder.decode(data)
    except msgspec.DecodeError as exc:
        return KeyEntry(kind, name, revision, None, invalid=str(exc))
    if record.name != name:
        return KeyEntry(kind, name, revision, None, invalid=f"holds the record of {record.name}")
    return KeyEntry(kind, name, revision, record)


def encode_record(record: KeyRecord | TenantRecord) -> bytes:
    """The JSON a record is stored as."""
    return msgspec.json.encode(record)


def _split(bucket: str, subject: str) -> tuple[EntryKind, str] | None:
    kind, _, name = subject.removeprefix(f"$KV.{bucket}.").partition(".")
    if kind == "key" and name:
        return "key", name
    if kind == "tenant" and name:
        return "tenant", name
    return None


class KeysBucket:
    """The real :class:`~tokenwire.broker.KeyBook` over one connection (``MemoryKeys`` is its
    twin). Every request is one attempt bounded by ``timeout_s``; a broker that does not
    answer raises :class:`~tokenwire.broker.RequestFailed` (or ``BrokerUnavailable``)."""

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

    def _subject(self, kind: EntryKind, name: str) -> str:
        return f"$KV.{self.bucket}.{kind}.{name}"

    async def ensure(self) -> bool:
        """Make the bucket again where this process may (``make``); True when it answers."""
        if self._make is not None:
            await self._make()
        try:
            await self.last_revision()
        except RequestFailed:
            return False
        return True

    async def entry(self, kind: EntryKind, name: str) -> KeyEntry | None:
        """The entry as the bucket's leader holds it now; None when the name was never written."""
        js = self._nc.jetstream()
        with translated(self._nc, f"{kind} entry {name}"):
            try:
                msg = await js.get_last_msg(self._stream, self._subject(kind, name))
            except NotFoundError as exc:
                if exc.err_code != _NO_MESSAGE:
                    raise
                return None
        return entry_of(kind, name, msg.seq or 0, msg.headers, msg.data or b"")

    async def entries(self) -> list[KeyEntry]:
        """Every entry (deleted ones too), by kind and name."""
        subjects = await self._subjects()
        found = []
        for subject in subjects:
            split = _split(self.bucket, subject)
            if split is not None:
                entry = await self.entry(*split)
                if entry is not None:
                    found.append(entry)
        return sorted(found, key=lambda e: (e.kind, e.name))

    async def _subjects(self) -> list[str]:
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
        return sorted((info.get("state") or {}).get("subjects") or {})

    async def last_revision(self) -> int:
        """The bucket's last stored revision (a watcher that saw less is behind)."""
        what = f"info of {self._stream}"
        with translated(self._nc, what):
            reply = await self._nc.request(
                f"$JS.API.STREAM.INFO.{self._stream}", b"", self._timeout
            )
            info: dict[str, Any] = msgspec.json.decode(reply.data)
        if "error" in info:
            error = info["error"]
            raise RequestFailed(what, str(error.get("description")), error.get("err_code"))
        return int((info.get("state") or {}).get("last_seq") or 0)

    async def write(
        self,
        kind: EntryKind,
        name: str,
        record: KeyRecord | TenantRecord | None,
        *,
        expected: int | None,
    ) -> int | None:
        """Store ``record`` (None: delete the entry) when the entry is still at revision
        ``expected`` (0: never written; None: whatever it is). The new revision, or None when
        ``expected`` did not hold."""
        headers = {} if expected is None else {EXPECTED_LAST: str(expected)}
        value = b""
        if record is None:
            headers["KV-Operation"] = "DEL"
        else:
            value = encode_record(record)
        return await put_checked(
            self._nc,
            self._subject(kind, name),
            value,
            headers=headers,
            timeout_s=self._timeout,
            what=f"{kind} entry {name}",
        )

    async def watch(self, on_entry: Callable[[KeyEntry], None]) -> KeysWatch:
        """Call ``on_entry`` with every entry's last state now, then with each change as the
        broker stores it (an ordered consumer; it recovers from gaps by itself)."""

        async def deliver(msg: Msg) -> None:
            split = _split(self.bucket, msg.subject)
            seq = msg.metadata.sequence.stream
            if split is None:  # told all the same: a watcher counts the revisions it saw
                why = f"{msg.subject}: not a key or tenant entry"
                on_entry(KeyEntry("key", "", seq, None, invalid=why))
                return
            on_entry(entry_of(*split, seq, msg.headers, msg.data))

        config = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.LAST_PER_SUBJECT)
        with translated(self._nc, f"watch of {self._stream}"):
            sub = await ordered_subscribe(
                self._nc.jetstream(),
                f"$KV.{self.bucket}.>",
                stream=self._stream,
                config=config,
                cb=deliver,
            )
        return KeysWatch(sub)


class KeysWatch:
    """A running watch of the keys bucket (:meth:`KeysBucket.watch`); :meth:`stop` ends it."""

    def __init__(self, sub: Any) -> None:
        self._sub = sub

    async def stop(self) -> None:
        """Unsubscribe (the server drops the consumer)."""
        with contextlib.suppress(NatsError):
            await self._sub.unsubscribe()
