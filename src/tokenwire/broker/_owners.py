"""Whose a session is: its tenant, as the broker knows it (docs/gateway.md, "Keys and tenants").

- :func:`session_owner`: the tenant on the session's first retained step. Every step's first
  chunk (ordinal 0, which carries the step's ``key_name`` and ``tenant``) travels alone on the
  session's ``.first`` subject, so the first message on that subject names it; None when the
  stream retains no step of the session. One ``STREAM.MSG.GET`` (``next_by_subj``), answered by
  the stream's leader, so a step acknowledged before is always seen.
- :class:`SessionOwners`: that, plus the owner record ``<session>.owner`` in the step registry's
  KV bucket, for a session the stream does not hold yet: the first writer creates it (a KV
  create, so exactly one of two concurrent writers wins) and every later one reads it. The
  record ages out with the bucket's TTL (the stream's ``max_age``), after which the stream's
  retained steps decide again.

Every call is one attempt bounded by ``timeout_s``; a server that does not answer raises
:class:`~tokenwire.broker.RequestFailed` (or ``BrokerUnavailable``).
"""

from __future__ import annotations

import msgspec
from nats.aio.client import Client

from tokenwire.broker._errors import RequestFailed
from tokenwire.broker._messages import last_stored, next_stored
from tokenwire.broker._topology import Topology, stored_subject
from tokenwire.broker._translate import translated
from tokenwire.schemas import chunk_envelopes

_WRONG_LAST_SEQUENCE = 10071
_TIMEOUT_S = 5.0


class Owner(msgspec.Struct, frozen=True):
    """A session's owner: the ``tenant`` its steps are recorded with (None: none)."""

    tenant: str | None = None


_owner_decoder = msgspec.json.Decoder(Owner)


async def session_owner(
    nc: Client, topology: Topology, session: str, *, timeout_s: float = _TIMEOUT_S
) -> Owner | None:
    """The owner named by the session's first retained step, None when none is retained."""
    subject = stored_subject(topology, session, first=True)
    stored = await next_stored(nc, topology.stream_of(session), subject, timeout_s=timeout_s)
    if stored is None:
        return None
    with translated(nc, f"first step of {session}"):
        envelope = chunk_envelopes(stored.data)[0]
    tenant = envelope.tenant if isinstance(envelope.tenant, str) else None
    return Owner(tenant)


class SessionOwners:
    """The real owner lookups (see the module); :class:`MemorySessionOwners` is its twin."""

    def __init__(self, nc: Client, topology: Topology, timeout_s: float = _TIMEOUT_S) -> None:
        self._nc = nc
        self._topology = topology
        self._timeout = timeout_s

    async def retained(self, session: str) -> Owner | None:
        """:func:`session_owner`."""
        return await session_owner(self._nc, self._topology, session, timeout_s=self._timeout)

    async def adopt(self, session: str, owner: Owner) -> Owner:
        """Record ``owner`` as the session's unless a record exists; the recorded owner."""
        recorded = await self._create(session, owner)
        if recorded is None:  # aged out between the create and the read: once more
            recorded = await self._create(session, owner)
        if recorded is None:
            raise RequestFailed(f"owner record of {session}", "it keeps vanishing")
        return recorded

    async def _create(self, session: str, owner: Owner) -> Owner | None:
        """Create the record (``owner``), or read the existing one (None: gone meanwhile)."""
        bucket = self._topology.registry_bucket_of(session)  # the session's registry shard
        subject = f"$KV.{bucket}.{session}.owner"
        headers = {"Nats-Expected-Last-Subject-Sequence": "0"}
        with translated(self._nc, f"owner record of {session}"):
            reply = await self._nc.request(
                subject, msgspec.json.encode(owner), self._timeout, headers=headers
            )
            answer = msgspec.json.decode(reply.data) if reply.data else {}
        error = answer.get("error") if isinstance(answer, dict) else None
        if error is None:
            return owner
        if error.get("err_code") != _WRONG_LAST_SEQUENCE:
            raise RequestFailed(
                f"owner record of {session}", str(error.get("description")), error.get("err_code")
            )
        recorded = await last_stored(self._nc, f"KV_{bucket}", subject, timeout_s=self._timeout)
        if recorded is None:
            return None
        with translated(self._nc, f"owner record of {session}"):
            return _owner_decoder.decode(recorded.data)
